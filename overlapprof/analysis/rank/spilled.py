"""A trace file read into a store (in memory up to its budget, on disk past it), for
:mod:`overlapprof.analysis.rank.bounded`.

:class:`SpilledRows` takes the place of the in-memory columns while a file is read (the
``sink`` of :func:`~overlapprof.analysis.rank.scan.read_chunks`, in this process or from the
parts of a parallel read): in memory it keeps only the ``ProfilerStep#N`` spans and, until a
kernel is seen (CPU mode), the communication calls and annotations; in the store (the
:class:`~overlapprof.analysis.engine.store.Store` it is handed) the GPU activity
and runtime calls in buckets of correlation id (:data:`BUCKET_ROWS` rows each, about), the
communication calls in file order and, until a kernel is seen, the CPU ops that may be
compute (GPU mode never reads them). :func:`joined_by_time`
then joins each GPU event to its launch a correlation bucket at a time and puts the result in
buckets of time; :func:`calls_by_time` puts each call in every time bucket it overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapprof.analysis import vocabulary as V
from overlapprof.analysis.columns import GrowingColumns, Index
from overlapprof.analysis.intervals import event_ends
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.events import step_number
from overlapprof.analysis.rank.op_shapes import OpShapes
from overlapprof.analysis.rank.read import read_file
from overlapprof.analysis.rank.scan import IS_CORRELATED, IS_GPU, SCAN_COLUMNS, launch_rows, Scan, file_rows_hint
from overlapprof.analysis.spill import Sample, take
from overlapprof.errors import TraceError

# GPU events and runtime calls joined and classified at once (a bucket), and CPU ops (a window).
# Each row costs about ROW_WORK_BYTES while it is worked on.
BUCKET_ROWS = 1 << 19
ROW_WORK_BYTES = 200
MAX_BUCKETS = 512  # each a write buffer of every kind of bin (spill.WRITE_BUFFER): past ~50 GB of JSON the buckets grow instead

_GPU_ROW = np.dtype([("corr", "<f8"), ("ts", "<f8"), ("dur", "<f8"), ("codes", "i1"), ("name_ids", "<i4"),
                     ("thread", "<i4"), ("row", "<i8")])
_CPU_ROW = np.dtype([("ts", "<f8"), ("dur", "<f8"), ("thread", "<i4"), ("name_ids", "<i4")])
_CALL_ROW = np.dtype([("ts", "<f8"), ("dur", "<f8"), ("thread", "<i4"), ("name_ids", "<i4"), ("collective", "i1")])
# the rows the communication records read (a call or annotation per operation): in the store, so past
# its budget they wait on disk as the other rows do
_REC_ROW = np.dtype([*((k, np.dtype(t)) for k, t in SCAN_COLUMNS.items()), ("row", "<i8")])
_JOINED_ROW = np.dtype([("ts", "<f8"), ("dur", "<f8"), ("codes", "i1"), ("name_ids", "<i4"), ("launch_ts", "<f8"),
                        ("launch_thread", "<i4"), ("corr", "<f8"), ("thread", "<i4"), ("row", "<i8")])
# Roles of a name, for the few rows and the CPU ops kept (bits).
_CALL, _STEP, _COMM_ANN, _CPU_COMPUTE, _SYNC, _RECORD_ANN = 1, 2, 4, 8, 16, 32


def _role(name: str, comm_ann) -> int:
    return ((_CALL if C.is_comm_call(name) else 0) | (_STEP if step_number(name) >= 0 else 0)
            | (_COMM_ANN if comm_ann.match(name) else 0) | (_CPU_COMPUTE if C.is_cpu_compute(name) else 0)
            | (_SYNC if C.is_host_sync(name) else 0) | (_RECORD_ANN if V.COMM_ANNOTATION.match(name) else 0))


class SpilledRows:
    """A file's complete events as :func:`~overlapprof.analysis.rank.scan.read_chunks` gives
    them (its ``sink``), kept as the module docstring says: ``few`` (the scan's columns, in row
    order), ``gpu`` (GPU events and runtime calls, bucket ``corr mod len(gpu)``, row order within
    a bucket; no correlation: bucket 0; ``row``: the file's row) and ``cpu`` (CPU ops that may be
    compute). With ``records``, ``recs`` keeps the calls and ``a:b`` annotations that the
    communication records read (the recorder's record rows but GPU events: the scan's columns
    and ``row``), a size per operation. With ``shapes``, ``shapes`` keeps the host's ops with
    their input shapes (:class:`~overlapprof.analysis.rank.op_shapes.OpShapes`), from the
    events themselves: a file read in one process."""

    def __init__(self, store, buckets: int, names: Index, comm_ann, records: bool = False, shapes: bool = False):
        self.names, self.comm_ann = names, comm_ann
        self.size = self.negative = 0
        self.kernels = False
        self.roles = np.zeros(0, dtype=np.int8)
        self.few = GrowingColumns(SCAN_COLUMNS, 1 << 12)
        # host synchronizations: runtime calls and CPU ops (those GPU mode reads: communication calls)
        self.syncs = GrowingColumns({"ts": np.float64, "end": np.float64, "read_in_gpu_mode": np.bool_}, 1 << 8)
        self.gpu = store.buckets("gpu", _GPU_ROW, buckets, columns=True)
        self.cpu = store.file("cpu", _CPU_ROW)
        self.calls = store.file("calls", _CALL_ROW)
        self.sample = Sample()  # of the times kept on disk: where the time buckets are cut
        self.recs = store.file("recs", _REC_ROW, columns=True) if records else None
        self.shapes = OpShapes(names) if shapes else None

    def append(self, columns: dict, corr: np.ndarray, events: list | None = None) -> None:
        codes, name_ids = columns["codes"], columns["name_ids"]
        if self.shapes is not None and events is not None:
            self.shapes.add(events, columns)
        if len(self.names.order) > self.roles.size:
            new = [_role(n, self.comm_ann) for n in self.names.order[self.roles.size :]]
            self.roles = np.concatenate((self.roles, np.array(new, dtype=np.int8)))
        role = self.roles[name_ids]
        is_cpu, is_ann = codes == C.CPU_OP, codes == C.ANNOTATION
        self.kernels = self.kernels or bool((codes == C.KERNEL).any())
        is_call = is_cpu & ((role & _CALL) != 0)
        row0 = self.size
        if self.recs is not None and (rec_rows := np.flatnonzero(is_call | (is_ann & ((role & _RECORD_ANN) != 0)))).size:
            self.recs.append({"row": rec_rows + row0, **{k: v[rec_rows] for k, v in columns.items()}})
        if is_call.any():
            rec = np.empty(int(np.count_nonzero(is_call)), dtype=_CALL_ROW)
            for k in _CALL_ROW.names:
                rec[k] = columns[k][is_call]
            self.calls.append(rec)
        # GPU mode (a kernel seen) reads the calls from disk and no annotation but the steps;
        # CPU mode needs its calls and communication annotations here
        few = (is_cpu | is_ann) & ((role & _STEP) != 0)
        if not self.kernels:
            few |= is_call | (is_ann & ((role & _COMM_ANN) != 0))
        if few.any():
            self.few.append(**{k: v[few] for k, v in columns.items()})
        is_runtime = codes == C.RUNTIME
        sync = (is_cpu | is_runtime) & ((role & _SYNC) != 0)
        if sync.any():
            self.syncs.append(ts=columns["ts"][sync], end=event_ends(columns["ts"][sync], columns["dur"][sync]),
                              read_in_gpu_mode=(is_runtime | is_call)[sync])
        linked = IS_CORRELATED[codes]
        if corr.size:
            at = np.flatnonzero(linked)
            rec = {k: columns[k][at] for k in ("ts", "dur", "codes", "name_ids", "thread")}
            rec["corr"], rec["row"] = corr, at + row0
            if len(self.gpu) == 1:  # the whole file at once: no bucket numbers
                self.gpu.files[0].append(rec)
            else:  # no correlation (NaN) or an infinite one: bucket 0
                known = np.nan_to_num(corr, nan=0.0, posinf=0.0, neginf=0.0)
                self.gpu.route(np.remainder(np.floor(known), len(self.gpu)).astype(np.int64), rec)
            self.sample.add(rec["ts"])
        compute = is_cpu & ((role & _CPU_COMPUTE) != 0)
        if compute.any():
            # Once a kernel is seen the rank is in GPU mode, which never reads these rows: they
            # are not kept (on the generated trace, half the rows, written to disk past the
            # budget). Their times still go to the sample, so the time buckets are cut where
            # they always were.
            if not self.kernels:
                rec = np.empty(int(np.count_nonzero(compute)), dtype=_CPU_ROW)
                for k in ("ts", "dur", "thread", "name_ids"):
                    rec[k] = columns[k][compute]
                self.cpu.append(rec)
            self.sample.add(columns["ts"][compute])
        self.negative += int(np.count_nonzero(columns["dur"] < 0))
        self.size += codes.size

    def result(self):
        return self if self.size else None

    @property
    def in_memory(self) -> bool:
        """Whether the file's rows were judged to fit the store's budget (one bucket, :func:`_buckets`):
        a parallel read then keeps this process's own parts in memory while they wait
        (:func:`~overlapprof.analysis.engine.parallel.read`), as a whole-file read did."""
        return len(self.gpu) == 1

    def host_syncs(self, gpu: bool) -> tuple[np.ndarray, np.ndarray]:
        """The starts and ends of the host synchronizations the classification reads
        (:func:`~overlapprof.analysis.rank.scan.drop_unread_rows`: in GPU mode, runtime calls
        and communication calls)."""
        if self.syncs.size == 0:
            return np.empty(0), np.empty(0)
        rows = self.syncs.arrays()
        keep = rows["read_in_gpu_mode"] if gpu else slice(None)
        return rows["ts"][keep], rows["end"][keep]

    def few_scan(self, path: str) -> Scan:
        """A scan of the rows kept in memory."""
        return Scan.of_columns(path, self.few.arrays())

    def remove(self) -> None:
        self.gpu.remove()
        self.cpu.remove()
        self.calls.remove()
        if self.recs is not None:
            self.recs.remove()


@dataclass
class SpilledFile:
    """A file read into :class:`SpilledRows`, with its top level and the counts of the device
    categories left out."""

    path: str
    rows: SpilledRows
    header: object
    unclassified: dict
    threads: list | None = None  # the keys of the file's thread codes ((pid, tid) pairs)
    recorder: object = None  # the CommRecorder that read it (records asked for): its argument rows


def _buckets(path, budget: float) -> int:
    """How many correlation buckets a file's GPU events and runtime calls go to: one when its
    rows, worked on at once, fit the store's ``budget`` (the whole file classified at once, as
    in memory), else about :data:`BUCKET_ROWS` rows each; by the file's text (a guess on the
    high side)."""
    rows = file_rows_hint(path)
    if rows * ROW_WORK_BYTES <= budget:
        return 1
    return int(min(MAX_BUCKETS, max(1, -(-rows // BUCKET_ROWS))))


def read_spilled(path: str, names: Index, comm_ann, store, parallel=None, recorder=None,
                 shapes: bool = False) -> SpilledFile:
    """A file read into :class:`SpilledRows` in ``store``: by ``parallel`` when it is given and
    the file is large (see :func:`~overlapprof.analysis.rank.read.read_file`), else by this one.
    ``recorder``: a :class:`~overlapprof.analysis.records.recorder.CommRecorder` that keeps no
    record rows (the records asked for), reading the args in the same pass. ``shapes``: keep
    the host's ops with their input shapes too (``rows.shapes``); the file is then read by this
    process (a parallel read's parts carry no event's args back)."""
    made: list[SpilledRows] = []
    if shapes:
        parallel = None

    def sink():
        for old in made:  # read again (not the line layout): what was kept goes
            old.remove()
        made.append(SpilledRows(store, _buckets(path, store.budget), names, comm_ann,
                                recorder is not None, shapes))
        return made[-1]

    rows, unclassified, header, threads, recorder = read_file(path, names, recorder, parallel, sink=sink)
    if rows is None:
        raise TraceError(path, "no complete ('X') events: nothing to measure")
    return SpilledFile(str(path), rows, header, unclassified, list(threads), recorder)


def joined_by_time(f: SpilledFile, edges: np.ndarray, store, needs=None, wait_id: int = -1, each=None):
    """The file's GPU events with their launch (time and thread, NaN and -1: none), in buckets of
    the time that places them among the calls (the launch's, else their own start): each
    correlation bucket holds every event with its runtime call, so the join is exact; so does
    it each CUDA sync event with the ``cudaEventRecord`` call it waits on: with ``needs`` (a
    :class:`~overlapprof.analysis.rank.waits.NeedTimes`), the waits (name id ``wait_id``) go there.
    ``each(items, fn)``: how the correlation buckets are joined (default :func:`map`); this
    thread reads and routes them."""
    out = store.buckets("joined", _JOINED_ROW, edges.size + 1, columns=True)

    def read():
        for bucket in f.rows.gpu:
            rec = bucket.read()
            bucket.remove()
            yield rec

    def join(rec):
        launch = launch_rows(rec["codes"], rec["corr"])  # rows of rec, for its GPU rows
        waits = None
        if needs is not None and (is_sync := rec["codes"] == C.SYNC).any():
            record = launch_rows(rec["codes"], rec["corr"], of=(C.SYNC,))  # of the sync rows, in row order
            sync = take(rec, is_sync)
            wait = (sync["name_ids"] == wait_id) & (record >= 0)
            at = record[wait]
            waits = (sync["thread"][wait], sync["ts"][wait], rec["thread"][at], rec["ts"][at])
        joined = take(rec, IS_GPU[rec["codes"]])
        found = launch >= 0
        joined["launch_ts"] = np.where(found, rec["ts"][np.maximum(launch, 0)], np.nan)
        joined["launch_thread"] = np.where(found, rec["thread"][np.maximum(launch, 0)], -1)
        at = None if edges.size == 0 else np.searchsorted(edges, np.where(found, joined["launch_ts"], joined["ts"]),
                                                          "right")
        return joined, at, waits

    for joined, at, waits in each(read(), join) if each else map(join, read()):
        if waits is not None:
            needs.add_waits(*waits)
        if at is None:  # one time bucket
            out.files[0].append(joined)
        else:
            out.route(at, joined)
    return out


def calls_by_time(f: SpilledFile, edges: np.ndarray, store):
    """The file's communication calls, each in every time bucket it overlaps (in file order)."""
    out = store.buckets("calls", _CALL_ROW, edges.size + 1)
    for rec in f.rows.calls.windows(BUCKET_ROWS):
        first = np.searchsorted(edges, rec["ts"], "right")
        last = np.searchsorted(edges, rec["ts"] + np.maximum(rec["dur"], 0), "right")
        for k in range(int((last - first).max()) + 1):  # a call longer than a bucket: in each
            at = np.flatnonzero(last - first >= k)
            out.route(first[at] + k, rec[at])
    f.rows.calls.remove()
    return out
