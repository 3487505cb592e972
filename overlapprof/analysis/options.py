"""What an analysis is asked to do: :class:`AnalyzeOptions`, the one definition of
``overlapprof.analyze``'s keywords.

Two records of options, two things: an ``AnalyzeOptions`` is the *request* (as a caller or the
command line gives it: rates as text, how the work runs, a progress callback), and
:class:`~overlapprof.report.Options` is what the report *records* of it (:meth:`AnalyzeOptions.recorded`:
checked, normalized, only what changes the numbers, saved with the report).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlapprof.errors import InputError
from overlapprof.report import Options

# The memory a rank process keeps its rows in by default (--memory-budget): a rank's rows cost
# about 200 bytes each while a bucket is classified, so up to about 5 million complete events
# (a trace of about 500 MB of JSON) are one bucket, in memory, as fast as a whole-file read; past
# that the rank is read a bucket at a time and its peak stays about here, on a laptop as on a
# node that measures several ranks at once (docs/engine.md).
DEFAULT_MEMORY_BUDGET = 1 << 30

if TYPE_CHECKING:
    from overlapprof.analysis.engine.pool import DaskScheduler


@dataclass(frozen=True)
class AnalyzeOptions:
    """The options of one analysis; every one off (the defaults) = OVERLAP.md's whole-trace
    window. ``overlapprof.analyze(paths, **fields)`` takes these fields as keywords."""

    comm_kernels: Sequence[str] | str = ()
    """Extra regular expressions (searched, any case) naming communication kernels
    (``--comm-kernel``); default none."""
    comm_backends: Sequence[str] | str = ()
    """CPU mode: backend names whose ``<backend>:<op>`` annotations are communication besides
    OVERLAP.md's (gloo, nccl, mpi, ucc, xccl, hccl) (``--comm-backend``); default none."""
    cycle: int | None = None
    """Only each rank's N-th profiler cycle (1: the first), of a run directory recorded with
    ``--repeat`` or of a folder of ``tensorboard_trace_handler`` files whose processes saved
    several (``--cycle``; recorded as ``Options.cycle``); default None: every cycle, each
    rank's cycles together."""
    allow_partial: bool = False
    """A rank whose trace is bad becomes a warning instead of an error (``--allow-partial``);
    default off."""
    drop_last_step: bool = False
    """HolisticTraceAnalysis's filter: events of each rank's last ProfilerStep are left out
    (``--drop-last-step``; listed in ``Report.filters``); default off."""
    require_launch: bool = False
    """HolisticTraceAnalysis's filter: GPU events whose launching runtime call is not in the trace
    are left out (``--require-launch``; listed in ``Report.filters``); default off."""
    like_hta: bool = False
    """Both filters, and each rank's ``metrics`` as HolisticTraceAnalysis 0.5.0's
    ``get_comm_comp_overlap`` computes them (``--like-hta``; steps and kinds keep the two
    filters); default off."""
    comm_ops: bool = False
    """Keep one :class:`~overlapprof.report.CommRecord` per communication kernel or annotation in
    each RankReport's ``comm_records`` (``--comm-ops``; recorded as ``Options.comm_records``);
    default off."""
    comms: bool = True
    """Match communication across ranks into ``Report.crossrank``: wait vs transfer, stragglers,
    bandwidth, warm-up (off: ``--no-comms``; recorded as ``Options.crossrank``); default on."""
    align_clocks: bool = False
    """Align the clocks of different hosts (of every rank, when traces name no host) on their
    matched collectives first (``--align-clocks``); default off."""
    lanes: bool = False
    """Give each rank its :class:`~overlapprof.report.Lanes`: every step's unions on the common
    clock, for ``overlapprof export``; default off."""
    op_shapes: bool = False
    """Keep each rank's host ops with their recorded input shapes from its read
    (``Analyzed.op_shapes``; what ``whatif``'s ``micro_batches`` reads of a pipeline's ops): the
    args of every ``cpu_op`` are decoded, and a large file is read by one process. Changes no
    number of the report; default off."""
    step_range: str | None = None
    """Nsight Systems exports: the NVTX range that marks a step (``--step-range``; its ranges are
    numbered in time order); default None: ``ProfilerStep#N`` ranges, else the whole capture."""
    rank_map: dict | str | None = None
    """Nsight Systems exports: the rank of each process, ``{pid: rank}`` or ``"PID=RANK,..."``
    (``--rank-map``); default None: by device, in the order of the inputs."""
    memory_budget: int | str | None = None
    """The memory each rank process may keep the trace's rows in while they are measured: bytes,
    or a size as text (``"4GB"``, ``"512MiB"``; ``--memory-budget``). Each rank is read once into
    a store that keeps its rows in memory up to this many bytes and writes the rest to ``$TMPDIR``
    (about 15% of the JSON's size), a bucket at a time; a rank whose rows fit is one bucket and
    touches no disk. The same report whatever the budget. 0: every row on disk. Default None:
    :data:`DEFAULT_MEMORY_BUDGET` (1 GiB)."""
    reference_bandwidth: str | float | None = None
    """The bus bandwidth a rank's transfer should reach: a rate as text (``"25GB/s"``,
    ``"2gbit"``) or bytes/s; transfer time beyond it is slow transfer (``--reference-bandwidth``).
    Default None: the shared link of a ``--link-rate`` run."""
    workers: int | None = None
    """Processes for ranks, or for the pieces of one large file (``--workers``); 1: everything in
    this process. Default None: one per CPU. The report is the same with any number."""
    progress: Callable[[int, int, str], object] | None = None
    """Called as ``progress(done, total, path)`` as ranks finish; default None."""
    dask_scheduler: DaskScheduler | str | None = None
    """Analyze the ranks on this Dask cluster instead: a DaskScheduler, or its address
    ``tcp://HOST:PORT`` (``--dask-scheduler``; ``workers`` unused), its workers reading the traces
    at their paths (a filesystem they share); default None."""

    def recorded(self) -> Options:
        """The report's record of these options, checked (InputError, one line, on a bad pattern,
        backend, rate or size) and normalized (lists; the filters ``like_hta`` implies; bytes/s;
        bytes)."""
        self.budget_bytes()  # checked
        patterns = [self.comm_kernels] if isinstance(self.comm_kernels, str) else list(self.comm_kernels or ())
        for p in patterns:
            try:
                re.compile(p)
            except re.error as exc:
                raise InputError(f"comm kernel pattern {p!r} is not a valid regular expression ({exc})") from None
        reference = _bytes_per_s(self.reference_bandwidth)
        backends = [self.comm_backends] if isinstance(self.comm_backends, str) else list(self.comm_backends or ())
        for b in backends:
            if not re.fullmatch(r"[A-Za-z0-9_]+", b):
                raise InputError(f"comm backend {b!r} is not a backend name (letters, digits and '_')")
        if self.cycle is not None and (not isinstance(self.cycle, int) or self.cycle < 1):
            raise InputError(f"--cycle {self.cycle!r}: a profiler cycle's number, 1 for the first")
        return Options(
            cycle=self.cycle,
            step_range=self.step_range,
            rank_map=_rank_map(self.rank_map),
            comm_kernels=patterns,
            comm_backends=backends,
            drop_last_step=self.drop_last_step or self.like_hta,
            require_launch=self.require_launch or self.like_hta,
            like_hta=self.like_hta,
            allow_partial=self.allow_partial,
            comm_records=self.comm_ops,
            crossrank=self.comms,
            align_clocks=self.align_clocks,
            lanes=self.lanes,
            reference_bandwidth=reference,
        )


    def budget_bytes(self) -> int:
        """:attr:`memory_budget` in bytes (:data:`DEFAULT_MEMORY_BUDGET` when not given);
        InputError on a bad size."""
        if self.memory_budget is None:
            return DEFAULT_MEMORY_BUDGET
        from overlapprof.units import SIZE_HELP, size_bytes

        got = size_bytes(self.memory_budget)
        if got is None:
            raise InputError(f"--memory-budget {self.memory_budget!r}: not a size; use {SIZE_HELP}")
        return got


def _rank_map(given: dict | str | None) -> dict[int, int]:
    """``--rank-map``: ``{pid: rank}`` from a dict or ``"PID=RANK,PID=RANK"``; InputError (one line) when malformed."""
    if not given:
        return {}
    if isinstance(given, dict):
        pairs = given.items()
    else:
        pairs = (p.split("=", 1) for p in given.replace(" ", "").split(",") if p)
    try:
        out = {int(pid): int(rank) for pid, rank in pairs}
    except ValueError:
        raise InputError(f"--rank-map {given!r}: give PID=RANK pairs separated by commas (4321=0,4322=1)") from None
    if len(set(out.values())) < len(out) or min(out.values(), default=0) < 0:
        raise InputError(f"--rank-map {given!r}: each process needs its own rank (0 or more)")
    return out


def _bytes_per_s(rate: str | float | None) -> float | None:
    if rate is None:
        return None
    from overlapprof.units import HELP, bits_per_s

    bits = bits_per_s(rate) if isinstance(rate, str) else float(rate) * 8
    if bits is None or bits <= 0:
        raise InputError(f"--reference-bandwidth {rate!r}: not a rate; use {HELP}")
    return bits / 8
