"""One rank of an Nsight Systems export read into the :class:`~overlapprof.analysis.rank.scan.Scan`
a Kineto trace of it would give, so that everything after the scan (classification, unions,
metrics, the cross-rank section, causes and bounds) does not know which format it read.

What maps to what (docs/nsys.md has the table):

- ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` rows -> ``kernel`` / ``gpu_memcpy`` /
  ``gpu_memset`` events on the lane (device, stream), kernels named by their demangled name;
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` -> ``cuda_runtime`` calls on the thread (pid, tid), named
  without nsys's ``_vNNNN`` suffix (``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``), joined to
  the GPU activity by ``correlationId`` as Kineto's ``correlation``;
- ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` -> ``cuda_sync`` events; a stream wait waits on the
  last ``cudaEventRecord`` its thread made before its ``cudaStreamWaitEvent`` call (what Kineto
  calls ``wait_on_cuda_event_record_corr_id``; the export does not link them when
  ``CUPTI_ACTIVITY_KIND_CUDA_EVENT`` is empty, as it is by default);
- NVTX ranges (torch's ``emit_nvtx`` or the user's): ``ProfilerStep#N`` (or the ``--step-range``
  name, numbered in time order) -> step annotations; ``c10d::*`` and ``record_param_comms`` ->
  communication calls; ``aten::item``/``aten::_local_scalar_dense`` -> host synchronizations.

Times become µs from the capture's start (``TARGET_INFO_SESSION_START_TIME``), the header's
``baseTimeNanoseconds`` being that instant since the epoch. The rows are selected and ordered
by SQLite and fetched in batches into numpy (:mod:`overlapprof.trace.nsys`); Python touches only
distinct names, threads and NVTX ranges.
"""

from __future__ import annotations

import re

import numpy as np

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.scan import Scan, launch_rows
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.errors import TraceError
from overlapprof.trace import nsys as N
from overlapprof.trace.decode import DistributedInfo, EventArgs, TraceFile

_VERSION_SUFFIX = re.compile(r"_v\d+$")
_STEP = "ProfilerStep#{}"
# NVTX ranges read (LIKE patterns): steps, communication calls, host synchronizations.
NVTX_PATTERNS = ["ProfilerStep#%", "c10d::%", "record_param_comms%", "aten::item%", "aten::_local_scalar_dense%"]
_CODE = np.array([C.KERNEL, C.MEMCPY, C.MEMSET], dtype=np.int8)  # by N.ACTIVITY's index


def runtime_name(name: str) -> str:
    """A CUDA API call's name as Kineto writes it (nsys adds the API version: ``_v7000``)."""
    return _VERSION_SUFFIX.sub("", name)


def _names(values: np.ndarray, name_of, names: Index) -> np.ndarray:
    """The name ids of ``values`` (codes of some kind), ``name_of(value)`` computed once per distinct value."""
    if values.size == 0:
        return np.empty(0, np.int32)
    distinct, inverse = np.unique(values, return_inverse=True)
    return np.array([names[name_of(int(v))] for v in distinct], dtype=np.int32)[inverse]


def _wait_records(rt: np.ndarray, rt_names: np.ndarray, is_record: np.ndarray, api_corr: np.ndarray) -> np.ndarray:
    """Of each stream wait (the correlation of its ``cudaStreamWaitEvent`` call), the correlation
    of the last ``cudaEventRecord`` call (``is_record``, by name id) its thread made at or before
    it; -1: none."""
    out = np.full(api_corr.size, -1, dtype=np.int64)
    if api_corr.size == 0 or rt.shape[0] == 0:
        return out
    order = np.argsort(rt[:, 3], kind="stable")
    sorted_corr = rt[order, 3]
    at = np.minimum(np.searchsorted(sorted_corr, api_corr), sorted_corr.size - 1)
    found = sorted_corr[at] == api_corr
    call = np.where(found, order[at], -1)
    records = np.flatnonzero(is_record[rt_names])  # rt is ordered by start
    for tid in np.unique(rt[call[found], 2]).tolist():
        mine = records[rt[records, 2] == tid]
        q = np.flatnonzero(found & (rt[np.maximum(call, 0), 2] == tid))
        k = np.searchsorted(rt[mine, 0], rt[call[q], 0], side="right") - 1
        out[q] = np.where(k >= 0, rt[mine[np.maximum(k, 0)], 3], -1)
    return out


def _collectives(nv: np.ndarray, nv_names: list[str]) -> dict[int, str]:
    """{NVTX row: collective} for the ``record_param_comms`` ranges (emit_nvtx gives them no
    arguments): the op of the innermost ``c10d::*`` range around its start on its thread
    (``c10d::alltoall_base_`` -> ``alltoall_base_``), what Kineto's ``Collective name`` says."""
    calls = [i for i, n in enumerate(nv_names) if n.startswith("c10d::")]
    out = {}
    for i, n in enumerate(nv_names):
        if n != C.PARAM_COMMS:
            continue
        around = [c for c in calls if nv[c, 2] == nv[i, 2] and nv[c, 0] <= nv[i, 0] < nv[c, 1]]
        if around:
            out[i] = nv_names[max(around, key=lambda c: nv[c, 0])][len("c10d::"):]
    return out


def read(name, names: Index, recorder: CommRecorder | None = None, step_range: str | None = None,
         rank_map: dict | None = None) -> tuple[Scan, list]:
    """The scan of the rank ``name`` (an export, or one process of it: :func:`overlapprof.trace.nsys.member`)
    and the reader's notes on it (the schema, what the export lacks). ``step_range``: the NVTX
    range that marks a step; ``rank_map``: {pid: rank} (the rank is the header's ``distributedInfo``)."""
    path, pid = N.split(name)
    with N.open_export(path) as ex:
        gp = N.global_pid(ex, pid)
        pid = (gp >> N.TID_BITS) & 0xFFFFFF
        act, rt, sy = N.activity(ex, gp), N.runtime(ex, gp), N.syncs(ex, gp)
        patterns = NVTX_PATTERNS + ([step_range.replace("%", r"\%"), step_range + ", %"] if step_range else [])
        nv, nv_names = N.nvtx_ranges(ex, gp, patterns)
        kernels = act[:, 0] == N.ACTIVITY.index(N.KERNEL)
        strings = ex.strings(np.unique(np.concatenate((act[kernels, 6], rt[:, 4]))))
        notes = [f"{path}: Nsight Systems export, schema {ex.version} ({ex.product})"]
        if not N.payloads(ex):
            notes.append(f"{path}: no NVTX payloads in the export: the bytes and peers of communication are missing "
                         "(the cross-rank section works from times alone)")
        start_ns, utc_ns = ex.start_ns, ex.utc_ns
    if step_range is not None:
        picked = [i for i, n in enumerate(nv_names) if n == step_range]
        if not picked:
            raise TraceError(name, f"no NVTX range named {step_range!r} (--step-range)")
        for k, i in enumerate(picked):
            nv_names[i] = _STEP.format(k)
    na, nr, nn, ns = act.shape[0], rt.shape[0], nv.shape[0], sy.shape[0]
    start = np.concatenate((act[:, 1], rt[:, 0], nv[:, 0], sy[:, 0]))
    end = np.concatenate((act[:, 2], rt[:, 1], nv[:, 1], sy[:, 1]))
    ts = (start - start_ns) / 1e3
    dur = (end - start) / 1e3
    is_step = np.array([bool(C.STEP_NAME.match(n)) for n in nv_names], dtype=bool)
    codes = np.concatenate((_CODE[act[:, 0]], np.full(nr, C.RUNTIME, np.int8),
                            np.where(is_step, C.ANNOTATION, C.CPU_OP).astype(np.int8), np.full(ns, C.SYNC, np.int8)))

    act_ids = np.full(na, names[N.MEMSET_NAME], dtype=np.int32)
    act_ids[kernels] = _names(act[kernels, 6], lambda v: strings.get(v, ""), names)
    copies = act[:, 0] == N.ACTIVITY.index(N.MEMCPY)
    act_ids[copies] = _names(act[copies, 6], lambda k: f"Memcpy {N.COPY_KINDS.get(k, 'Unknown')}", names)
    rt_ids = _names(rt[:, 4], lambda v: runtime_name(strings.get(v, "")), names)
    nv_ids = np.array([names[n] for n in nv_names], dtype=np.int32)
    sy_ids = _names(sy[:, 3], lambda v: N.SYNC_NAMES.get(v, "Unknown Sync"), names)
    name_ids = np.concatenate((act_ids, rt_ids, nv_ids, sy_ids)).astype(np.int32)

    # Threads: GPU lanes (device, stream), then host threads (pid, tid); a sync's device is that
    # of its stream's activity (the export's deviceId of synchronizations is not reliable).
    lanes, lane_of = np.unique(act[:, 3:5], axis=0, return_inverse=True) if na else (np.empty((0, 2), np.int64), act[:, 0])
    device = {int(s): int(d) for d, s in lanes}
    first_device = int(lanes[0, 0]) if lanes.shape[0] else 0
    sync_keys = [(device.get(int(s), first_device), int(s)) for s in np.unique(sy[:, 2]).tolist()]
    keys = [(int(d), int(s)) for d, s in lanes]
    keys += [k for k in sync_keys if k not in set(keys)]
    code_of = {k: i for i, k in enumerate(keys)}
    streams, stream_of = np.unique(sy[:, 2], return_inverse=True)
    sync_lane = np.array([code_of[(device.get(int(s), first_device), int(s))] for s in streams],
                         dtype=np.int32)[stream_of.reshape(-1)] if ns else np.empty(0, np.int32)
    host_tid = np.concatenate((rt[:, 2], nv[:, 2]))
    tids, host_of = np.unique(host_tid, return_inverse=True)
    keys += [((int(g) >> N.TID_BITS) & 0xFFFFFF, int(g) & ((1 << N.TID_BITS) - 1)) for g in tids]
    thread = np.concatenate((np.asarray(lane_of, np.int64).reshape(-1), host_of.reshape(-1) + len(code_of),
                             sync_lane)).astype(np.int32)

    # Correlations of the correlated rows (GPU, runtime, sync), in row order: a stream wait's is
    # that of the event record it waits on (as Kineto's cuda_sync events), other syncs their call's.
    record_name = np.array([n.startswith("cudaEventRecord") for n in names.order], dtype=bool)
    sync_corr = sy[:, 4].copy()
    waits = sy[:, 3] == 2
    sync_corr[waits] = _wait_records(rt, rt_ids, record_name, sy[waits, 4])
    corr = np.concatenate((act[:, 5], rt[:, 3], sync_corr)).astype(np.float64)
    corr[corr < 0] = np.nan
    launch = launch_rows(codes, corr)
    sync_record = launch_rows(codes, corr, of=(C.SYNC,)) if ns else np.empty(0, np.int64)
    collective = np.full(codes.size, -1, np.int8)
    named = _collectives(nv, nv_names)
    param_rows = np.array(sorted(named), dtype=np.int64) + na + nr
    for i, op in named.items():
        collective[na + nr + i] = C.KIND_CODE[C.comm_kind(op)]
    records = None
    if recorder is not None:
        recorder._roles()  # the new names' roles
        for rows in recorder.batches(codes, name_ids):
            if (rows := np.setdiff1d(rows, param_rows)).size:
                recorder.add_decoded(rows, None)
        if param_rows.size:
            recorder.add_decoded(param_rows, [EventArgs(collective=named[i]) for i in sorted(named)])
        records = recorder.records(thread, keys)
    info = None
    if rank_map:
        if pid not in rank_map:
            raise TraceError(name, f"process {pid} is not in --rank-map ({', '.join(map(str, rank_map))})")
        info = DistributedInfo(rank=rank_map[pid])
    header = TraceFile(distributedInfo=info, baseTimeNanoseconds=utc_ns if utc_ns else None)
    scan = Scan(str(name), ts=ts, dur=dur, codes=codes, launch=launch, name_ids=name_ids, thread=thread,
                collective=collective, negative=int(np.count_nonzero(dur < 0)),
                events=int(codes.size), header=header, records=records, sync_record=sync_record)
    return scan, notes
