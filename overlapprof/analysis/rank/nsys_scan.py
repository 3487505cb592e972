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
``baseTimeNanoseconds`` being that instant since the epoch. The rows are selected by SQLite,
fetched in batches into numpy and sorted there (:mod:`overlapprof.trace.nsys`); Python touches
only distinct names, threads and the NVTX ranges read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from overlapprof.analysis.columns import Index
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.scan import IS_GPU, Scan, launch_rows
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.analysis.records.table import innermost
from overlapprof.errors import TraceError
from overlapprof.trace import nsys as N
from overlapprof.trace.decode import DistributedInfo, EventArgs, TraceFile

_VERSION_SUFFIX = re.compile(r"_v\d+$")
_STEP = "ProfilerStep#{}"
# NVTX ranges read (GLOB patterns): steps, communication calls, host synchronizations.
NVTX_PATTERNS = ["ProfilerStep#*", "c10d::*", "record_param_comms*", "aten::item*", "aten::_local_scalar_dense*"]
_CODE = np.array([C.KERNEL, C.MEMCPY, C.MEMSET], dtype=np.int8)  # by N.ACTIVITY's index
KINETO_CATEGORY = {C.KERNEL: "kernel", C.MEMCPY: "gpu_memcpy", C.MEMSET: "gpu_memset", C.RUNTIME: "cuda_runtime",
                   C.CPU_OP: "cpu_op", C.ANNOTATION: "user_annotation", C.SYNC: "cuda_sync"}


def _glob_literal(text: str) -> str:
    """``text`` as a GLOB pattern matching itself (``*``, ``?`` and ``[`` in brackets)."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def runtime_name(name: str) -> str:
    """A CUDA API call's name as Kineto writes it (nsys adds the API version: ``_v7000``)."""
    return _VERSION_SUFFIX.sub("", name)


def _names(values: np.ndarray, name_of, names: Index) -> np.ndarray:
    """The name ids of ``values`` (codes of some kind), ``name_of(value)`` computed once per distinct value."""
    if values.size == 0:
        return np.empty(0, np.int32)
    distinct, inverse = np.unique(values, return_inverse=True)
    return np.array([names[name_of(int(v))] for v in distinct], dtype=np.int32)[inverse]


def _wait_records(rt: dict, is_record: np.ndarray, api_corr: np.ndarray) -> np.ndarray:
    """Of each stream wait (the correlation of its ``cudaStreamWaitEvent`` call), the correlation
    of the last ``cudaEventRecord`` call (``is_record``: of each API call, ordered by start) its
    thread made at or before it; -1: none."""
    out = np.full(api_corr.size, -1, dtype=np.int64)
    if api_corr.size == 0 or rt["start"].size == 0:
        return out
    start, tid, corr = rt["start"], rt["tid"], rt["corr"]
    order = np.argsort(corr, kind="stable")
    sorted_corr = corr[order]
    at = np.minimum(np.searchsorted(sorted_corr, api_corr), sorted_corr.size - 1)
    found = sorted_corr[at] == api_corr
    call = np.where(found, order[at], -1)
    records = np.flatnonzero(is_record)
    for thread in np.unique(tid[call[found]]).tolist():
        mine = records[tid[records] == thread]
        q = np.flatnonzero(found & (tid[np.maximum(call, 0)] == thread))
        k = np.searchsorted(start[mine], start[call[q]], side="right") - 1
        out[q] = np.where(k >= 0, corr[mine[np.maximum(k, 0)]], -1)
    return out


def _collectives(nv: dict, nv_names: list[str]) -> dict[int, str]:
    """{NVTX row: collective} for the ``record_param_comms`` ranges (emit_nvtx gives them no
    arguments): the op of the innermost ``c10d::*`` range around its start on its thread
    (``c10d::alltoall_base_`` -> ``alltoall_base``), what Kineto's ``Collective name`` says."""
    calls = np.array([i for i, n in enumerate(nv_names) if n.startswith("c10d::")], dtype=np.int64)
    params = np.array([i for i, n in enumerate(nv_names) if n == C.PARAM_COMMS], dtype=np.int64)
    if calls.size == 0 or params.size == 0:
        return {}
    thread = np.unique(nv["tid"], return_inverse=True)[1].reshape(-1)  # small codes (innermost counts them)
    start, end = nv["start"], nv["end"]
    # innermost() takes closed ends: a range ends at the ns before its end
    found = innermost(thread[calls], start[calls], end[calls] - 1, thread[params], start[params])
    return {int(p): nv_names[int(calls[f])][len("c10d::"):].rstrip("_") for p, f in zip(params, found) if f >= 0}


@dataclass
class Rows:
    """A rank's rows, as the scan has them (GPU activity, API calls, NVTX ranges, syncs, in that
    order): times in µs from the capture's start, category codes, name ids, thread codes and
    ``keys`` (the thread of each code: (device, stream) lanes, then (pid, tid) threads), the
    correlations of the correlated rows, the collectives of ``record_param_comms`` ranges."""

    ts: np.ndarray
    dur: np.ndarray
    codes: np.ndarray
    name_ids: np.ndarray
    thread: np.ndarray
    keys: list
    corr: np.ndarray
    named: dict  # row -> collective
    pid: int
    notes: list
    utc_ns: int | None


def _threads(lane: np.ndarray, host_tid: np.ndarray, sync_streams: np.ndarray, pid: int) -> tuple[np.ndarray, list]:
    """Thread codes of the activity rows (``lane``: device << 32 | stream), host rows (their
    tid) and sync rows (their stream), and the key of each code: GPU lanes (device, stream), then
    host threads (pid, tid). A sync's device is that of its stream's activity (the export's
    deviceId of synchronizations is not reliable)."""
    lanes, lane_of = np.unique(lane, return_inverse=True)
    keys = [(d >> 32, d & 0xFFFFFFFF) for d in lanes.tolist()]
    device = {s: d for d, s in keys}
    first = keys[0][0] if keys else 0
    streams, stream_of = np.unique(sync_streams, return_inverse=True)
    code_of = {k: i for i, k in enumerate(keys)}
    sync_codes = []
    for s in streams.tolist():
        key = (device.get(s, first), s)
        if key not in code_of:
            code_of[key] = len(keys)
            keys.append(key)
        sync_codes.append(code_of[key])
    tids, host_of = np.unique(host_tid, return_inverse=True)
    host0 = len(keys)
    keys += [(pid, t) for t in tids.tolist()]
    thread = np.concatenate((lane_of.reshape(-1), host_of.reshape(-1) + host0,
                             np.array(sync_codes, dtype=np.int64)[stream_of.reshape(-1)]))
    return thread.astype(np.int32), keys


def read_rows(name, names: Index, step_range: str | None = None) -> Rows:
    """The rows of the rank ``name`` (an export, or one process of it: :func:`overlapprof.trace.nsys.member`).
    ``step_range``: the NVTX range that marks a step (numbered ``ProfilerStep#0``... in time order).
    The export's integer columns are let go of as the scan's are made from them."""
    path, pid = N.split(name)
    with N.open_export(path) as ex:
        gp = N.global_pid(ex, pid)
        act, rt, sy = N.activity(ex, gp), N.runtime(ex, gp), N.syncs(ex, gp)
        own = [_glob_literal(step_range), _glob_literal(step_range) + ", *"] if step_range else []
        nv, nv_names = N.nvtx_ranges(ex, gp, NVTX_PATTERNS + own)
        kernels = act["table"] == N.ACTIVITY.index(N.KERNEL)
        strings = ex.strings(np.unique(np.concatenate((act["name"][kernels], rt["name"]))))
        notes = [f"{path}: Nsight Systems export, schema {ex.version} ({ex.product})"]
        why = ("its NVTX payloads are not decoded by this reader" if N.payloads(ex)
               else "no NVTX payloads in the export")
        notes.append(f"{path}: {why}: the bytes and peers of communication are missing (the cross-rank section "
                     "works from times alone)")
        start_ns, utc_ns = ex.start_ns, ex.utc_ns
    pid = (gp >> N.TID_BITS) & 0xFFFFFF
    if step_range is not None:
        picked = [i for i, n in enumerate(nv_names) if n == step_range]
        if not picked:
            raise TraceError(name, f"no NVTX range named {step_range!r} (--step-range)")
        for k, i in enumerate(picked):
            nv_names[i] = _STEP.format(k)
    na, nr, ns = act["start"].size, rt["start"].size, sy["start"].size
    is_step = np.array([bool(C.STEP_NAME.match(n)) for n in nv_names], dtype=bool)
    codes = np.concatenate((_CODE[act["table"]], np.full(nr, C.RUNTIME, np.int8),
                            np.where(is_step, C.ANNOTATION, C.CPU_OP).astype(np.int8), np.full(ns, C.SYNC, np.int8)))
    act_ids = np.full(na, names[N.MEMSET_NAME], dtype=np.int32)
    act_ids[kernels] = _names(act["name"][kernels], lambda v: strings.get(v, ""), names)
    copies = act["table"] == N.ACTIVITY.index(N.MEMCPY)
    act_ids[copies] = _names(act["name"][copies], N.copy_name, names)
    rt_ids = _names(rt["name"], lambda v: runtime_name(strings.get(v, "")), names)
    name_ids = np.concatenate((act_ids, rt_ids, np.array([names[n] for n in nv_names], dtype=np.int32),
                               _names(sy["type"], lambda v: N.SYNC_NAMES.get(v, "Unknown Sync"), names)))
    del act_ids, kernels, copies, act["name"], act["table"], rt["name"]
    thread, keys = _threads(act.pop("lane"), np.concatenate((rt["tid"], nv["tid"])), sy["stream"], pid)
    # Correlations of the correlated rows (GPU, runtime, sync), in row order: a stream wait's is
    # that of the event record it waits on (as Kineto's cuda_sync events), other syncs their call's.
    is_record = np.array([n.startswith("cudaEventRecord") for n in names.order], dtype=bool)[rt_ids]
    sync_corr = sy["corr"].copy()
    waits = sy["type"] == 2
    sync_corr[waits] = _wait_records(rt, is_record, sy["corr"][waits])
    del is_record, rt["tid"], rt_ids
    corr = np.concatenate((act.pop("corr"), rt.pop("corr"), sync_corr)).astype(np.float64)
    corr[corr < 0] = np.nan
    named = {na + nr + i: op for i, op in _collectives(nv, nv_names).items()}
    ts = np.empty(codes.size)  # filled a part at a time: the export's columns go as they are read
    dur = np.empty(codes.size)
    at = 0
    for part in (act, rt, nv, sy):
        n = part["start"].size
        ts[at : at + n] = part["start"] - start_ns
        dur[at : at + n] = part.pop("end") - part["start"]
        part.pop("start")
        at += n
    ts /= 1e3
    dur /= 1e3
    return Rows(ts, dur, codes, name_ids.astype(np.int32), thread, keys, corr, named, pid, notes, utc_ns)


def read(name, names: Index, recorder: CommRecorder | None = None, step_range: str | None = None,
         rank_map: dict | None = None) -> tuple[Scan, list]:
    """The scan of the rank ``name`` (:func:`read_rows`) and the reader's notes on it (the
    schema, what the export lacks). ``rank_map``: {pid: rank} (the rank is the header's
    ``distributedInfo``)."""
    r = read_rows(name, names, step_range)
    codes = r.codes
    launch = launch_rows(codes, r.corr)
    sync_record = launch_rows(codes, r.corr, of=(C.SYNC,)) if (codes == C.SYNC).any() else np.empty(0, np.int64)
    collective = np.full(codes.size, -1, np.int8)
    param_rows = np.array(sorted(r.named), dtype=np.int64)
    for row, op in r.named.items():
        collective[row] = C.KIND_CODE[C.comm_kind(op)]
    records = None
    if recorder is not None:
        rows = np.setdiff1d(np.concatenate(recorder.batches(codes, r.name_ids)), param_rows)
        if recorder.own:  # --comm-ops: the GPU events' own device, stream and correlation (the first rows)
            gpu, rows = rows[IS_GPU[codes[rows]]], rows[~IS_GPU[codes[rows]]]
            lanes = [r.keys[t] for t in r.thread[gpu].tolist()]
            corr = [None if c != c else int(c) for c in r.corr[gpu].tolist()]  # GPU rows come first: theirs
            recorder.add_decoded(gpu, [EventArgs(device=d, stream=st, correlation=c)
                                       for (d, st), c in zip(lanes, corr)])
        if rows.size:
            recorder.add_decoded(rows, None)
        if param_rows.size:
            recorder.add_decoded(param_rows, [EventArgs(collective=r.named[i]) for i in param_rows.tolist()])
        records = recorder.records(r.thread, r.keys)
    info = None
    if rank_map:
        if r.pid not in rank_map:
            raise TraceError(name, f"process {r.pid} is not in --rank-map ({', '.join(map(str, rank_map))})")
        info = DistributedInfo(rank=rank_map[r.pid])
    header = TraceFile(distributedInfo=info, baseTimeNanoseconds=r.utc_ns or None)
    scan = Scan(str(name), ts=r.ts, dur=r.dur, codes=codes, launch=launch, name_ids=r.name_ids, thread=r.thread,
                collective=collective, negative=int(np.count_nonzero(r.dur < 0)), events=int(codes.size),
                header=header, records=records, sync_record=sync_record)
    return scan, r.notes


def events_between(name, lo: float, hi: float, step_range: str | None = None) -> tuple[list, list[str]]:
    """The rows of rank ``name`` that start in [lo, hi) (µs on its clock) as Kineto's events
    would be: (name, category, ts, dur, thread code) by row, and each thread code's label
    (``overlapprof export``'s events of a step or window)."""
    names = Index()
    r = read_rows(name, names, step_range)
    rows = np.flatnonzero((r.ts >= lo) & (r.ts < hi)).tolist()
    cats = [KINETO_CATEGORY.get(c, "") for c in r.codes.tolist()] if rows else []
    labels = [f"device {a} / stream {b}" if k < _lanes(r) else f"pid {a} / tid {b}" for k, (a, b) in enumerate(r.keys)]
    events = [(names.order[r.name_ids[i]], cats[i], float(r.ts[i]), float(r.dur[i]), int(r.thread[i])) for i in rows]
    return events, labels


def _lanes(r: Rows) -> int:
    """How many of the keys are GPU lanes (those of activity and sync rows)."""
    device_rows = (r.codes != C.RUNTIME) & (r.codes != C.CPU_OP) & (r.codes != C.ANNOTATION)
    return int(r.thread[device_rows].max()) + 1 if device_rows.any() else 0
