"""Reading a trace file's complete events into columns (compact numpy arrays), a chunk at a time.

The events are read a chunk at a time (:mod:`overlapprof.trace.reader`, with
:data:`~overlapprof.trace.decode.ROWS_DECODER`: the events of other phases than "X" without
their fields) with their ``args`` left raw; list comprehensions pull out of each chunk the
complete events' ``ts``, ``dur``, category code, name id and thread; the args that anything
reads (the correlations of the launch join, the kinds of ``record_param_comms`` and, when asked,
the communication records of a :class:`~overlapprof.analysis.records.recorder.CommRecorder`) are
taken, joined and decoded once for all of them (:mod:`overlapprof.analysis.rank.chunk_args`).
The chunk's values are copied into the file's columns
(:class:`~overlapprof.analysis.columns.GrowingColumns`) and the chunk is dropped. The times are
checked a chunk at a time and a problem is raised, naming the event, once the file is read
(:class:`Problems`). At the end the rows the classification never reads are dropped
(:func:`drop_unread_rows`: on real GPU traces about half), and the correlations are replaced by
each GPU event's launching runtime call (:func:`launch_rows`). The result is a :class:`Scan`
(:mod:`overlapprof.analysis.rank.read` reads a file into one, by several processes when it is
large), classified by :mod:`overlapprof.analysis.rank.events`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter

import numpy as np

from overlapprof.analysis.columns import Cache, GrowingColumns, Index
from overlapprof.analysis.intervals import event_ends
from overlapprof.analysis.rank import classify as C
from overlapprof.analysis.rank.chunk_args import IS_CORRELATED, chunk_args
from overlapprof.analysis.records.recorder import CommRecorder, Records, hashable
from overlapprof.errors import TraceError
from overlapprof.trace.decode import ROWS_DECODER, CompleteRow, TraceFile
from overlapprof.trace.ranges import text_bytes
from overlapprof.trace.reader import LayoutError, TraceReader


_CATEGORY = Cache(C.category_code)
_CATEGORY_OF: dict = {}  # the same, a plain dict: CPython looks up a plain dict's keys faster


def launch_rows(codes: np.ndarray, corr: np.ndarray, of=None) -> np.ndarray:
    """For the GPU events (the rows of a GPU category, in row order): the row of their launching
    runtime call (same correlation) or -1. ``corr``: the correlation (NaN: none) of each row of
    a correlated category (GPU events, runtime calls, CUDA sync events), in row order.
    ``of``: the category codes to join instead of the GPU ones (a CUDA sync event's ``corr`` is
    the correlation of the ``cudaEventRecord`` it waits on: that call's row)."""
    linked = np.flatnonzero(IS_CORRELATED[codes])
    linked_codes = codes[linked]
    side = IS_GPU if of is None else np.isin(np.arange(C.CATEGORIES), of)
    gpu, runtime = np.flatnonzero(side[linked_codes]), np.flatnonzero(linked_codes == C.RUNTIME)
    if runtime.size == 0 or gpu.size == 0:
        return np.full(gpu.size, -1, dtype=np.int64)
    g_corr, rt_corr = corr[gpu], corr[runtime]
    order = np.argsort(rt_corr, kind="stable")  # NaN last
    rt_corr, runtime = rt_corr[order], runtime[order]
    pos = np.minimum(np.searchsorted(rt_corr, g_corr), rt_corr.size - 1)
    found = rt_corr[pos] == g_corr  # False for NaN
    return np.where(found, linked[runtime[pos]], -1)


@dataclass
class Scan:
    """One file's complete ("X") events as arrays, by row (in file order).

    ``launch``: the row of the launching runtime call of each GPU event (the rows of a GPU
    category, in row order; -1: not found, matched by correlation). ``sync_record``: of each CUDA
    sync event (in row order), the row of the ``cudaEventRecord`` call it waits on (-1: none). ``name_ids``: ids
    in the rank's name index. ``records``: what communication records need, when asked for.
    ``events``: the file's complete events; the rows are only those the classification reads
    (:func:`drop_unread_rows`).
    """

    path: str
    ts: np.ndarray
    dur: np.ndarray
    codes: np.ndarray
    launch: np.ndarray
    name_ids: np.ndarray
    thread: np.ndarray  # int32 (pid, tid) codes of GPU events, cpu_ops, annotations, runtime calls; -1 elsewhere
    collective: np.ndarray  # record_param_comms: the kind code of its `Collective name`; -1 elsewhere
    negative: int
    events: int
    header: TraceFile
    unclassified: dict[str, int] = field(default_factory=dict)
    records: Records | None = None
    sync_record: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @classmethod
    def of_columns(cls, path, columns: dict, launch: np.ndarray | None = None, records: Records | None = None) -> Scan:
        """A scan of rows given as columns, not read from a file (no counts, no header): the
        :data:`SCAN_COLUMNS` in ``columns`` (those absent are None, for a caller that reads only
        some); ``launch`` as above (None: no GPU event)."""
        return cls(str(path), **{k: columns.get(k) for k in SCAN_COLUMNS},
                   launch=np.empty(0, dtype=np.int64) if launch is None else launch, negative=0, events=0,
                   header=None, records=records)

    def end(self, rows) -> np.ndarray:
        """Where the events of ``rows`` end: ``ts + max(dur, 0)`` µs (computed, not kept: one
        float column less for every event of a file)."""
        return event_ends(self.ts[rows], self.dur[rows])


_THREADED = (C.CPU_OP, C.ANNOTATION, C.RUNTIME, C.SYNC, *C.GPU_CATEGORIES)


class Threads(dict):
    """(pid, tid) -> a small int code, one per distinct thread of a file, in order of first
    appearance."""

    def __init__(self):
        super().__init__()
        # The same codes as pid -> {tid: code}, plain dicts: looked up per event without a
        # (pid, tid) tuple, and CPython's lookup in a plain dict is faster than in a subclass.
        self._by_pid: dict = {}

    def __missing__(self, key):
        value = self[key] = len(self)
        return value

    def codes(self, events: list, rows: list | None = None) -> list:
        """The codes of ``events[rows]`` (None: every event; new threads get theirs in row order)."""
        if rows is not None:  # the events picked once: reading each by its row twice cost 2x
            events = _pick(events, rows)
        by_pid = self._by_pid
        try:
            return [by_pid[e.pid][e.tid] for e in events]
        except KeyError:  # a new thread: this chunk as the dict numbers it
            known = len(self)
            try:
                codes = [self[(e.pid, e.tid)] for e in events]
            except TypeError:
                return self._by_text(events)
            for (pid, tid), code in list(self.items())[known:]:
                by_pid.setdefault(pid, {})[tid] = code
            return codes
        except TypeError:
            return self._by_text(events)

    def _by_text(self, events: list) -> list:
        """:meth:`codes` when a pid or tid is unhashable (odd JSON): by its text."""
        return [self[(hashable(e.pid), hashable(e.tid))] for e in events]


# The columns of a file's complete events (see Scan), as read_chunks gives them.
# ``corr`` (the correlation of the GPU events and runtime calls, NaN: none) has a value per row
# of those categories only (IS_CORRELATED), in row order.
SCAN_COLUMNS = {"ts": np.float64, "dur": np.float64, "codes": np.int8, "name_ids": np.int32, "thread": np.int32,
                "collective": np.int8}
_IS_THREADED = np.isin(np.arange(C.CATEGORIES), _THREADED)
IS_GPU = np.isin(np.arange(C.CATEGORIES), C.GPU_CATEGORIES)
_READ_IN_GPU_MODE = np.isin(np.arange(C.CATEGORIES), (*C.GPU_CATEGORIES, C.RUNTIME, C.ANNOTATION, C.SYNC))  # and some CPU ops
_READ_IN_ANY_MODE = ~np.isin(np.arange(C.CATEGORIES), (C.OTHER, C.UNKNOWN))  # correlated rows stay: corr is per row
_IS_HOST = np.isin(np.arange(C.CATEGORIES), (C.CPU_OP, C.ANNOTATION, C.RUNTIME))


@dataclass
class Problems:
    """The first event (number in the file) with a missing ``ts``, with a missing ``dur``, and
    whose ``ts + dur`` is not finite; checked a chunk at a time, raised in that order once the
    whole file is read (as one check over the whole file would)."""

    ts: int | None = None
    dur: int | None = None
    end: int | None = None

    def check(self, ts: np.ndarray, dur: np.ndarray, end: np.ndarray, index) -> None:
        if np.isfinite(end).all():
            return
        for name, bad in (("ts", np.isnan(ts)), ("dur", np.isnan(dur)), ("end", ~np.isfinite(end))):
            if getattr(self, name) is None and bad.any():
                setattr(self, name, int(index()[np.argmax(bad)]))

    def raise_first(self, path) -> None:
        for name in ("ts", "dur"):
            if getattr(self, name) is not None:
                raise TraceError(path, f"event {getattr(self, name)}: {name!r} is missing")
        if self.end is not None:
            raise TraceError(path, f"event {self.end}: 'ts' + 'dur' is out of range")


def rows_hint(text_bytes: int) -> int:
    """A guess at the number of events in ``text_bytes`` of trace text, on the high side (Kineto
    events take 150-400 bytes): room reserved for the columns, so that they rarely grow (what
    is reserved and not written takes no memory)."""
    return max(text_bytes // 100, 1 << 16)


class FileColumns:
    """Where :func:`read_chunks` puts a file's columns by default: in memory, growing a chunk at
    a time. (:class:`overlapprof.analysis.rank.bounded.SpilledRows` takes their place to keep
    them on disk.)"""

    def __init__(self, rows: int):
        self.columns, self.links = GrowingColumns(SCAN_COLUMNS, rows), GrowingColumns({"corr": np.float64}, rows // 2)

    @property
    def size(self) -> int:
        return self.columns.size

    def append(self, columns: dict, corr: np.ndarray, events: list | None = None) -> None:
        """A chunk's :data:`SCAN_COLUMNS` and the correlations of its correlated rows, in row order."""
        self.columns.append(**columns)
        if corr.size:
            self.links.append(corr=corr)

    def result(self) -> dict | None:
        """The columns and ``corr`` (None: no rows)."""
        return {**self.columns.arrays(), **self.links.arrays()} if self.size else None


def _pick(items: list, rows: list) -> list:
    """``[items[i] for i in rows]``, gathered by ``itemgetter`` (in C, no bytecode per row)."""
    if len(rows) == 1:
        return [items[rows[0]]]
    return list(itemgetter(*rows)(items)) if rows else []


def _complete(events: list) -> list:
    """Which events are complete ("X"). ROWS_DECODER decodes them as CompleteRow structs, and
    the others as structs of their phase (``ph`` on the type, not a field): a type test, faster
    than reading ``ph``; events whose ``ph`` is a field (ThreadRowEvents) by it."""
    if events and "ph" in getattr(type(events[0]), "__struct_fields__", ("ph",)):
        return [e.ph == "X" for e in events]
    return [type(e) is CompleteRow for e in events]


def _complete_or_all(events: list) -> list | None:
    """:func:`_complete`, or None when every event is: one set of the chunk's types (in C)
    tells that for ROWS_DECODER's structs without a mask and a second pass over it."""
    if set(map(type, events)) == {CompleteRow}:
        return None
    complete = _complete(events)
    return None if all(complete) else complete


def _category_codes(events: list) -> np.ndarray:
    try:
        codes = [_CATEGORY_OF[e.cat] for e in events]
    except KeyError:
        codes = [_CATEGORY[e.cat] for e in events]
        _CATEGORY_OF.update(_CATEGORY)
    return np.fromiter(codes, np.int8, len(codes))  # np.array of a list of ints: about 1.2x slower


def _name_ids(events: list, names: Index) -> np.ndarray:
    try:
        plain = names.plain
        ids = [plain[e.name] for e in events]
    except KeyError:  # a new name: numbered by the Index
        ids = [names[e.name] for e in events]
    return np.fromiter(ids, np.int32, len(ids))


def _times(values: list) -> np.ndarray:
    """Times (µs) as floats, None as NaN."""
    try:
        return np.fromiter(values, np.float64, len(values))
    except TypeError:  # a None: np.array makes it NaN
        return np.array(values, dtype=np.float64)


def read_chunks(path, chunks, names: Index, recorder: CommRecorder | None, threads: Threads, rows: int,
                 sink=None):
    """The complete events of ``chunks`` as the columns :data:`SCAN_COLUMNS` and ``corr`` (None:
    there are none), the counts of the device categories left out, and the :class:`Problems` of their
    times. ``names``/``threads``: the ids given to names and threads; ``rows``: room reserved;
    ``sink``: where the columns go (default :class:`FileColumns`; what is returned is its ``result()``)."""
    sink = sink if sink is not None else FileColumns(rows)
    problems = Problems()
    unknown = _Unknown()
    params_id = names[C.PARAM_COMMS]
    for chunk in chunks:
        events = chunk.events
        complete = _complete_or_all(events)
        if complete is None:
            xe = events
            index = lambda c=chunk, n=len(events): np.arange(c.start, c.start + n)  # noqa: E731
        else:
            xe = list(compress(events, complete))
            index = lambda c=chunk, m=complete: np.flatnonzero(m) + c.start  # noqa: E731
        if not xe:
            continue
        codes = _category_codes(xe)
        if (odd := np.flatnonzero(codes == C.UNKNOWN)).size:
            unknown.sort(xe, odd, codes)
        name_ids = _name_ids(xe, names)
        linked = np.flatnonzero(IS_CORRELATED[codes])
        params = np.flatnonzero((codes == C.CPU_OP) & (name_ids == params_id)).tolist()
        corr, kinds = chunk_args(path, xe, codes, name_ids, linked, params, index, recorder, sink.size)
        thread = np.full(len(xe), -1, dtype=np.int32)
        located = np.flatnonzero(_IS_THREADED[codes])
        if located.size:
            got = threads.codes(xe, None if located.size == len(xe) else located.tolist())
            thread[located] = np.fromiter(got, np.int32, len(got))
            unknown.see_hosts(thread[_IS_HOST[codes]])
        collective = np.full(len(xe), -1, dtype=np.int8)
        if params:
            collective[params] = kinds
        ts, dur = _times([e.ts for e in xe]), _times([e.dur for e in xe])
        with np.errstate(invalid="ignore", over="ignore"):
            end = event_ends(ts, dur)
        problems.check(ts, dur, end, index)
        columns = dict(ts=ts, dur=dur, codes=codes, name_ids=name_ids, thread=thread, collective=collective)
        sink.append(columns, corr, xe)
    return sink.result(), unknown.on_devices(threads), problems


class _Unknown:
    """The events of categories :mod:`classify` does not know, by (category, process): those of a
    process that holds no host event are device work OVERLAP.md does not classify
    (:meth:`on_devices`). Events with no category in a process torch's old autograd profiler
    named get that process's category instead (:data:`classify.LEGACY_PROCESSES`)."""

    def __init__(self):
        self.counts: dict[tuple, int] = {}
        self.host_threads: set[int] = set()  # thread codes of cpu_ops, annotations, runtime calls

    def see_hosts(self, threads: np.ndarray) -> None:
        """Note the thread codes of a chunk's host events (np.unique would import numpy.ma)."""
        if threads.size:
            mark = np.zeros(int(threads.max()) + 1, dtype=bool)
            mark[threads] = True
            self.host_threads.update(np.flatnonzero(mark).tolist())

    def sort(self, events: list, rows: np.ndarray, codes: np.ndarray) -> None:
        """Count ``events[rows]`` (of unknown categories) by (category, process), or give them
        their legacy process's category in ``codes``."""
        rows = rows.tolist()
        cats = [events[i].cat for i in rows]
        if "" not in cats:  # no legacy event: counted at once
            try:
                for key, n in Counter(zip(cats, [events[i].pid for i in rows])).items():  # in order of appearance
                    self.counts[key] = self.counts.get(key, 0) + n
                return
            except TypeError:  # an unhashable pid: one at a time, below
                pass
        for i in rows:
            e = events[i]
            if not e.cat and isinstance(e.pid, str) and e.pid in C.LEGACY_PROCESSES:
                codes[i] = C.LEGACY_PROCESSES[e.pid]
            else:
                key = (e.cat, hashable(e.pid))
                self.counts[key] = self.counts.get(key, 0) + 1

    def on_devices(self, threads: Threads) -> dict[str, int]:
        """{category: events} of the unknown categories outside the host's processes."""
        if not self.counts:
            return {}
        host = {key[0] for key, code in threads.items() if code in self.host_threads}
        found: dict[str, int] = {}
        for (cat, pid), n in self.counts.items():
            if pid not in host:
                found[cat or "(none)"] = found.get(cat or "(none)", 0) + n
        return found


def drop_unread_rows(arrays: dict, names: list[str]) -> np.ndarray | None:
    """Drop from ``arrays`` (a column at a time, rows keeping their order) the rows that the
    rank's classification never reads, before the launch join: events of other categories
    (``python_function``, ``gpu_user_annotation``, unclassified device activity, ...) and, in a
    file with kernels (which puts its rank in GPU mode), the CPU ops that are neither a
    ``ProfilerStep#N`` nor a communication call. GPU mode reads GPU events, runtime calls,
    annotations and those CPU ops; CPU mode CPU ops and annotations. On the real GPU traces
    of ``tests/data`` 35-63% of the rows are kept. Returns which rows were kept (None: all)."""
    codes = arrays["codes"]
    if (codes == C.KERNEL).any():
        wanted = np.array([bool(C.STEP_NAME.match(n)) or C.is_comm_call(n) for n in names], dtype=bool)
        keep = _READ_IN_GPU_MODE[codes]
        keep |= wanted[arrays["name_ids"]] & (codes == C.CPU_OP)  # masks, not row lists: a byte per row
    else:
        keep = _READ_IN_ANY_MODE[codes]
        if keep.all():
            return None
    for name in SCAN_COLUMNS:
        arrays[name] = arrays[name][keep]  # the column before is freed here
    return keep


def file_rows_hint(path) -> int:
    """:func:`rows_hint` of a file's text (:func:`~overlapprof.trace.ranges.text_bytes`)."""
    try:
        return rows_hint(text_bytes(path))
    except OSError:  # the reader words the error
        return rows_hint(0)


def read_serially(path, names: Index, recorder: CommRecorder | None, sink=None):
    """Read a file in this process, a chunk at a time, into ``sink()`` (a new one each time it
    is read: None, :class:`FileColumns`): ``(sink's result, unclassified, header, threads,
    recorder)``. A file not in the line layout is read again with the generic reader (and a
    fresh recorder). Raises the first problem of the times once the file is read."""
    reader = TraceReader(path, ROWS_DECODER)
    rows, threads = file_rows_hint(path), Threads()
    make = sink or (lambda: None)
    try:
        got, unclassified, problems = read_chunks(path, reader.chunks(), names, recorder, threads, rows, make())
    except LayoutError:
        if recorder is not None:
            recorder = recorder.fresh()
        threads = Threads()
        got, unclassified, problems = read_chunks(path, reader.chunks(generic=True), names, recorder, threads, rows,
                                                   make())
    problems.raise_first(path)
    return got, unclassified, reader.header, threads, recorder
