"""Whether the ranks an analysis measured make one run: each rank settled once, no recording
twice, no rank's cycles from two runs, one world size, backend and time (``analyze`` checks
them once every rank is measured; each problem is one :class:`~overlapprof.errors.InputError`
line naming the files)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from overlapprof.errors import InputError
from overlapprof.trace.discover import TraceGroup, rank_from_name

if TYPE_CHECKING:
    from overlapprof.analysis.rank_result import RankResult

# Ranks whose recorded windows are further apart than this are from different runs.
SAME_RUN_GAP_US = 3600e6


def settle_ranks(results: list[RankResult], groups: list[TraceGroup]) -> None:
    """Give each report its rank: distributedInfo, else run.json, else file name, else order."""
    claimed: dict[int, RankResult] = {}
    unplaced = []
    for result, group in zip(results, groups):
        r = result.report
        if result.dist_rank is not None:
            if group.run_rank is not None and group.run_rank != result.dist_rank:
                raise InputError(
                    f"{result.files[0]}: distributedInfo says rank {result.dist_rank} "
                    f"but run.json lists it under rank {group.run_rank}"
                )
            r.rank, r.rank_source = result.dist_rank, "distributedInfo"
        elif group.run_rank is not None:
            r.rank, r.rank_source = group.run_rank, "run.json"
        elif (name_rank := rank_from_name(Path(result.files[0]).name)) is not None:
            r.rank, r.rank_source = name_rank, "file name"
        else:
            unplaced.append(result)
            continue
        if r.rank in claimed:
            other = claimed[r.rank]
            raise InputError(
                f"{result.files[0]}: rank {r.rank} ({r.rank_source}) is also claimed by "
                f"{other.files[0]} ({other.report.rank_source})"
            )
        claimed[r.rank] = result
    free = (n for n in range(len(results) + len(claimed) + 1) if n not in claimed)
    for result in unplaced:
        result.report.rank, result.report.rank_source = next(free), "order"


def one_recording_each(results: list[RankResult]) -> None:
    """InputError when two inputs hold one recording (a copy, without its ``distributedInfo`` or
    under another name): the same events at the same times, so the same counts, window and
    measures, which the ranks of one job never share. Two that name different ranks in their
    ``distributedInfo`` are two ranks whatever they hold (a generated trace may repeat one)."""
    seen: dict[tuple, list[RankResult]] = {}
    for r in results:
        if r.recording is None:
            continue
        same = seen.setdefault(r.recording, [])
        first = next((o for o in same if None in (o.dist_rank, r.dist_rank)), None)
        same.append(r)
        if first is not None:
            raise InputError(
                f"{first.files[0]} and {r.files[0]} hold the same recording ({r.report.events} events at the same "
                f"times), not two ranks: analyze one of them (overlapprof analyze {first.files[0]})")


def cycles_of_one_recording(results: list[RankResult]) -> None:
    """InputError when a rank's files (its profiler cycles) repeat a ProfilerStep: recordings of
    two runs under one worker name (a second run into the same folder), not one profiler's cycles."""
    for r in results:
        steps = [s.step for s in r.report.steps]
        if len(r.files) > 1 and len(set(steps)) < len(steps):
            twice = next(s for s in steps if steps.count(s) > 1)
            raise InputError(
                f"{r.files[0]}: ProfilerStep#{twice} is in two of rank {r.report.rank}'s {len(r.files)} files "
                f"({', '.join(Path(f).name for f in r.files[:4])}{' ...' if len(r.files) > 4 else ''}): two runs "
                "under one worker name, not the profiler cycles of one process: analyze each run's files apart")


def check_one_run(results: list[RankResult]) -> None:
    """Ranks of different runs mixed: world sizes, backends or recorded windows disagree."""
    for attr in ("world_size", "backend"):
        known = [r for r in results if getattr(r, attr) is not None]
        for r in known[1:]:
            if getattr(r, attr) != getattr(known[0], attr):
                raise InputError(
                    f"{r.files[0]}: ranks of different runs mixed: {attr} is {getattr(r, attr)!r} here "
                    f"but {getattr(known[0], attr)!r} in {known[0].files[0]}"
                )
    for r in results:
        if r.world_size is not None and not 0 <= r.report.rank < r.world_size:
            raise InputError(f"{r.files[0]}: rank {r.report.rank} is outside world_size {r.world_size}")
    timed = [r for r in results if r.window is not None]
    if timed:
        first = min(timed, key=lambda r: r.window[0])
        for r in timed:
            if r.window[0] - first.window[1] > SAME_RUN_GAP_US:
                hours = (r.window[0] - first.window[1]) / 3600e6
                raise InputError(
                    f"{r.files[0]}: ranks of different runs mixed: recorded {hours:.1f} h after "
                    f"{first.files[0]} ended"
                )
