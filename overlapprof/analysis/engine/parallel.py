"""One large trace file read by several processes, with the result of reading it in one.

The file's text is cut at event boundaries (:mod:`overlapprof.trace.ranges`); this process and
``workers - 1`` worker processes each read some of the pieces as
:mod:`overlapprof.analysis.rank.scan` reads a file, into parts that come together in file order
(:mod:`overlapprof.analysis.rank.parts`): the report is the same with any number of workers.
This module decides who reads what. The worker processes are forked here, or are the workers
of a Dask cluster (:func:`read`'s ``pool``; then only the plain ranges below, without stealing).

How the text reaches the workers:

- plain JSON: each worker reads its own byte ranges of the file (seek, read);
- gzip: each worker inflates the stream from the start and drops the text before its range
  (``skip``). That costs every worker the inflation of the text before its range, yet it was
  faster than this process inflating the stream once and sending pieces to the workers (2 GB,
  2026-12-04: 1.45x against 1.24x over one worker; mtia end to end 0.30 s against 0.38 s), which
  was cut.

This process reads ranges too. They are handed out from both ends (:class:`_Schedule`): the
pool's processes take them from the front, one at a time, and this process from the back; once
all are handed out, this process takes the unread end of a range the pool is reading (work
stealing, :class:`~overlapprof.analysis.engine.claims.Claims`, whose file each pool task opens
by the path its job carries). The pool is the stdlib's process pool
(:func:`~overlapprof.analysis.engine.pool.forked`); a pool process's part comes back through a
file of a private temporary folder (:func:`~overlapprof.analysis.rank.parts.pool_read`), and only
the file's name through the pool's pipe, so the process never waits for this one to read it.

Memory: each worker holds a piece of text and its decoded events, plus the arrays of its range;
the parent, the columns of the file (as when reading it alone,
:class:`~overlapprof.analysis.rank.parts.Merge`), its own parts not merged yet (the last ranges,
merged once the pool's are) and, for gzip, the end of each pool range kept for a thief (at most
:data:`KEPT_MAX` each).

A worker that meets anything unexpected (not the line layout, a bad event, a damaged gzip)
reports it, and the file is read again in this process, which words the error exactly as always.
"""

from __future__ import annotations

from functools import partial

from overlapprof.analysis import engine
from overlapprof.analysis.columns import Index
from overlapprof.analysis.engine.ahead import ahead, both
from overlapprof.analysis.engine.claims import Claims, can_share
from overlapprof.analysis.rank.parts import Job, Merge, Part, pool_read, read_part, read_tail, unspool
from overlapprof.analysis.rank.scan import rows_hint
from overlapprof.analysis.records.recorder import CommRecorder
from overlapprof.analysis.spill import folder_name, make_folder
from overlapprof.errors import OverlapprofError
from overlapprof.trace import ranges as TR
from overlapprof.trace.reader import LayoutError

# Smallest byte range given to a worker (plain JSON). Each range is a part to send back and
# merge: on 80 MB, 32 MB ranges (two) took 0.634 s, 16 MB (five) 0.742 s, 8 MB 0.742 s.
RANGE_MIN = 32 << 20
RANGES_PER_WORKER = 8  # ranges per worker: a slow worker or a dense range does not finish last alone
# gzip ``skip``: inflating a byte to drop it costs about this share of decoding it (isal inflates
# the generated 2 GB trace at over 1 GB/s, overlapprof decodes it at about 100 MB/s; mtia's
# dense half 0.017 s of inflation against 0.25 s). Ranges further in are shorter by that much,
# and a thief of a gzip range takes less than half of it (Claims.steal).
SKIP_COST = 0.1
KEPT_MIN, KEPT_MAX = 16 << 20, 128 << 20  # gzip: how much of a range's end this process keeps for a thief (Kept)
KEPT_AFTER = 1 << 20  # ... and past it: where the thief's text ends is the first event start there


def _kept_bytes(job: Job) -> int:
    """How much of the end of a gzip range the thief may find kept: an eighth of it, at least
    :data:`KEPT_MIN` (and at most half), at most :data:`KEPT_MAX` (this process holds it while
    it reads). The pool's readers were 5-12% slower than this process (2 GB: the pool's 1 GB
    range took 0.9 s longer than this process's skip and range together)."""
    length = job.b - job.a
    return min(max(KEPT_MIN, length // 8), length // 2, KEPT_MAX)


def _steal_min() -> int:
    """The smallest share worth taking (bytes): a quarter of a piece. On mtia, the dense range
    was often left with 3-7 MB (20-60 ms of decoding) when this process ran out of work."""
    return TR.PIECE_BYTES // 4


def _jobs_of_ranges(probe: TR.Probe, workers: int, base: Job) -> list[Job]:
    """Plain JSON: a few ranges per worker, of equal size. gzip: one per worker, as
    each inflates all the text before its range, each as long as its reader then has time for
    (:func:`~overlapprof.trace.ranges.split`, ``skip_cost``)."""
    count = workers if probe.gzip else min(workers * RANGES_PER_WORKER, (probe.size - probe.first) // RANGE_MIN)
    cuts = TR.split(probe, max(count, workers), SKIP_COST if probe.gzip else 0.0)
    return [Job(**{**base.__dict__, "a": a, "b": b, "bytes": (b if b is not None else probe.size) - a, "number": k})
            for k, (a, b) in enumerate(cuts)]


class _Schedule:
    """Ranges handed out from both ends: the pool's processes take them from the front, one at
    a time each (a new one as soon as one is done: this process looks before each piece it
    decodes), this process from the back; so neither waits while there is work. When all are
    handed out, this process takes the unread second half of a range the pool is reading
    (:class:`Claims`), again and again while one is large enough, then waits for the pool.
    Measured side by side with and without it (benchmarks/baseline_bench.py, 2026-12-05): on
    mtia with 2 workers it saved a tenth of the analysis (0.274 -> 0.249 s, median of 21); on a
    generated 300 MB gzip trace nothing."""

    def __init__(self, jobs: list[Job], pool, processes: int, claims: Claims | None = None,
                 skip_cost: float = 0.0, spill_own: bool = False):
        self.jobs, self.pool, self.processes, self.claims = list(jobs), pool, processes, claims
        # This process's parts wait for those before them: in memory, or (bounded memory) in files.
        self.read_here = partial(pool_read, between=self.refill) if spill_own else partial(read_part, between=self.refill)
        self.skip_cost = skip_cost  # gzip: what a thief pays to reach its range (Claims.steal)
        # gzip: the end of each range but the last, kept as this process inflates its way to its
        # own (the last ranges): a thief of it then reads it from memory
        self.kept = TR.Kept([(max(j.a, j.b - _kept_bytes(j)), j.b + KEPT_AFTER) for j in jobs[:-1]]) \
            if skip_cost and claims is not None and len(jobs) > 1 else None
        self.stolen = 0  # ranges taken from the pool's (tests read it)
        self.released = False  # the pool was shut down: nothing was left for it
        self.results: list = [None] * len(jobs)  # a future, or a Part read here, in file order
        self.front, self.back = 0, len(jobs)  # jobs[front:back]: not handed out yet
        self.refill()

    def refill(self) -> None:
        # results[:front]: futures, Parts read here, and None for those already yielded
        busy = sum(1 for r in self.results[: self.front] if _running(r))
        for _ in range(self.processes - busy):
            if self.front == self.back:
                return
            job = self.jobs[self.front]
            if self.claims is not None and job.b is not None and job.number < len(self.claims.slots) // 2:
                job.slot = job.number
                self.claims.open(job.slot, job.a, job.b)
            self.results[self.front] = self.pool.submit(read_range, job)
            self.front += 1

    def steal(self, head: int) -> bool:
        """Take the end of a range the pool has (from ``head`` on) and read it here; whether one was."""
        for k in range(head, self.front):
            got, job = self.results[k], self.jobs[k]
            if not _running(got) or job.slot is None:
                continue
            free = self.kept.start_of(job.b - 1) if self.kept is not None else None
            taken = self.claims.steal(job.slot, _steal_min(), self.skip_cost, free)
            if taken is None:
                continue
            cut, end = taken
            thief = Job(**{**job.__dict__, "a": cut, "b": end, "bytes": end - cut, "slot": None, "number": -1,
                            "kept": self.kept})
            self.jobs.insert(k + 1, thief)
            self.results.insert(k + 1, None)
            self.front += 1
            self.back += 1
            self.results[k + 1] = self.read_here(thief)
            self.stolen += 1
            return True
        return False

    def parts(self):
        """The parts in file order (a generator: they are merged as they come)."""
        head = 0
        while head < len(self.jobs):  # stealing inserts jobs after the head
            while True:
                got = self.results[head]
                if isinstance(got, Part) or (got is not None and got.done()):
                    break
                if self.front == self.back:  # all handed out: the head is in the pool
                    if self.claims is not None and self.steal(head):
                        continue
                    break
                self.back -= 1
                self.jobs[self.back].kept = self.kept
                self.results[self.back] = self.read_here(self.jobs[self.back])
            self.results[head] = None
            parts = unspool(got if isinstance(got, Part) else got.result())
            if not self.released and self.front == self.back and not any(_running(r) for r in self.results):
                # The pool has nothing left to do: let its processes go now. While they live,
                # each page this process writes that it shared with them when they were forked
                # is copied first (mtia: the rank's report took 14 ms, not 10).
                self.pool.shutdown()
                self.released = True
            yield from parts
            self.refill()
            head += 1


def _running(result) -> bool:
    """Whether a schedule's result is a pool task not done yet."""
    return result is not None and not isinstance(result, Part) and not result.done()


def read_range(job: Job) -> Part:
    """A pool's task: :func:`~overlapprof.analysis.rank.parts.pool_read` of ``job``, claiming
    its pieces in the claims its job names (a thief may take its end)."""
    if job.slot is None or job.claims is None:
        return pool_read(job)
    claims = Claims.attach(job.claims)
    try:
        return pool_read(job, claim=partial(claims.claim, job.slot))
    finally:
        claims.close()


class Reader:
    """How a rank's files are read: a large one by ``workers`` processes (this one and ``workers
    - 1`` of ``pool``), see :meth:`__call__`. The measuring code is handed one (``parallel``, see
    :func:`overlapprof.analysis.rank.read.read_file`) and never imports this module."""

    def __init__(self, workers: int, pool=None):
        self.workers, self.pool = workers, pool

    def __call__(self, path, names: Index, recorder: CommRecorder | None, sink=None):
        """:func:`read` with this reader's workers and pool."""
        return read(path, names, recorder, self.workers, pool=self.pool, sink=sink)

    def ahead(self, items, fn):
        """After the read, ``fn`` over ``items`` on a second core (:func:`~overlapprof.analysis.engine.ahead.ahead`)."""
        return ahead(items, fn)

    def both(self, first, second):
        """After the read, two functions on two cores (:func:`~overlapprof.analysis.engine.ahead.both`)."""
        return both(first, second)


def read(path, names: Index, recorder: CommRecorder | None, workers: int, pool=None, sink=None):
    """``(arrays, unclassified, header, threads)`` of the file as :func:`scan.read_chunks`
    gives them (and its top level, and the keys of its thread codes), read by ``workers``
    processes (which checked every ``ts`` and ``dur``: there are no problems to report); None
    when the file is small, not in the line layout, or anything went wrong (the caller then
    reads it in this process).

    ``pool``: where the ``workers - 1`` other processes come from: None, forked here
    (:func:`~overlapprof.analysis.engine.pool.forked`); else a callable that makes a
    :class:`~overlapprof.analysis.engine.pool.Pool` of them (``pool(processes)``), such as
    :class:`~overlapprof.analysis.engine.pool.DaskRanges`, whose processes may be on other
    machines: then the ranges are read as plain ranges, their parts come back as
    results, and nothing is shared (no work stealing). ``sink``: makes where the columns go
    (see :func:`scan.read_chunks`; its ``result()`` is the first item), and then this process's
    own parts wait in files as the pool's do, unless the sink keeps all its rows in memory
    (its ``in_memory``)."""
    try:
        probe = TR.probe(path)
    except (LayoutError, OverlapprofError, OSError):
        return None
    if probe.size - probe.first < engine.PARALLEL_MIN_TEXT or (pool is None and not can_share()):
        return None
    import shutil  # a small file needs no pool
    from concurrent.futures.process import BrokenProcessPool

    from overlapprof.analysis.engine.pool import forked

    base = Job(str(path), recorder is not None, recorder.comm_re if recorder else None,
                recorder.own if recorder else False, header=probe.header,
                record_rows=recorder.record_rows if recorder else True)
    into = sink() if sink is not None else None
    merged = Merge(names, recorder, rows_hint(probe.size - probe.first), into)
    # this process's parts wait in files only when the sink's rows do not all stay in memory
    spill_own = into is not None and not getattr(into, "in_memory", False)
    jobs = _jobs_of_ranges(probe, workers, base)
    tail, claims, top, last, spool = None, None, None, None, None
    try:  # the folder is made inside: a SIGTERM right after it still removes it (finally)
        if pool is None:
            spool = folder_name()  # recorded before it is made: the finally removes it whenever a SIGTERM lands
            make_folder(spool)
            base.spool = spool
            for job in jobs:
                job.spool = spool
        make_pool = pool
        if make_pool is None:
            claims = Claims(spool, len(jobs))
            for job in jobs:
                job.claims = claims.path
            make_pool = partial(forked, method="fork")  # where claims can be shared (can_share): POSIX
        with make_pool(workers - 1) as pool:
            schedule = _Schedule(jobs, pool, workers - 1, claims, SKIP_COST if probe.gzip else 0.0, spill_own)
            for part in schedule.parts():
                if part.failed:
                    return None
                if part.tail is not None:
                    tail = part.tail
                if part.top is not None:
                    top, last = part.top, part.last
                merged.add(part)
    except (BrokenProcessPool, OSError, OverlapprofError):  # a worker died, none could start, a damaged gzip
        return None
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - anything a worker did not expect: one process reads it, and words it
        return None
    finally:
        if claims is not None:
            claims.close()
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
    if top is None:
        if tail is None or (read := read_tail(base, probe.header, tail)) is None:
            return None
        top, last = read
    if last is not None:
        merged.add(last)
    arrays, unclassified = merged.result()
    return arrays, unclassified, top, list(merged.threads)


