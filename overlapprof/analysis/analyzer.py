"""``analyze(paths) -> Report``: the analyzer's entry point.

Each rank (one trace file, or the profiler cycles of one rank of a run directory) is decoded,
classified and measured on its own, in a worker process when there are several and it pays.
A worker returns a small :class:`RankResult` (the rank's report and what identifies its run),
never the raw events. The parent settles the rank numbers, checks that the ranks belong to one
run, and adds the cross-rank summary.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from overlapprof import __version__
from overlapprof.analysis import heap
from overlapprof.analysis.crossrank.inputs import crossrank_input
from overlapprof.analysis.crossrank.section import build_crossrank
from overlapprof.analysis.exposure import explain
from overlapprof.analysis.exposure.inputs import ExposureInput
from overlapprof.analysis import engine
from overlapprof.analysis.engine.store import Store
from overlapprof.analysis.one_run import check_one_run, cycles_of_one_recording, one_recording_each, settle_ranks
from overlapprof.analysis.options import DEFAULT_MEMORY_BUDGET, AnalyzeOptions
from overlapprof.analysis.rank import bounded
from overlapprof.analysis.rank.classify import compile_comm_annotations, compile_comm_kernels, lookalikes_warning
from overlapprof.analysis.rank.events import rank_events
from overlapprof.analysis.interference import InterferenceBuilder
from overlapprof.analysis.rank.metrics import summarize
from overlapprof.analysis.rank.unions import rank_unions
from overlapprof.analysis.rank_result import (RankResult, apply_filters, event_bounds, measured_again,
                                              recorded_window, report_and_exposure)
from overlapprof.errors import InputError, OverlapprofError, SpillError
from overlapprof.report import Options, Report
from overlapprof.trace import nsys
from overlapprof.trace.discover import TraceGroup, discover

# Below this many bytes of traces in all, starting worker processes costs more than it saves.
PARALLEL_MIN_BYTES = 8 << 20

FILTER_TEXT = {
    "drop_last_step": "--drop-last-step: events launched (or starting) at or after the start of each "
    "rank's last ProfilerStep are left out",
    "require_launch": "--require-launch: GPU events whose launching runtime call is not in the trace are left out",
    "like_hta": "--like-hta: HolisticTraceAnalysis 0.5.0's get_comm_comp_overlap (times rounded to whole µs, last "
    "step and unlaunched kernels left out when there are two or more ProfilerSteps, kernels classified by name) "
    "for each rank's totals; the cross-rank columns (wait, transfer) still cover every matched operation",
}


def analyze_group(files: list[str], options: Options, decode_workers: int = 1, range_pool=None,
                  ends: dict | None = None, budget: int | None = DEFAULT_MEMORY_BUDGET,
                  op_shapes: bool = False) -> RankResult:
    """Decode, classify and measure one rank's files (a large file in ``decode_workers``
    processes: forked here, or ``range_pool``'s, see :class:`~overlapprof.analysis.engine.parallel.Reader`),
    a time bucket at a time (:func:`~overlapprof.analysis.rank.bounded.measure`; an Nsight
    Systems export, whose rows SQLite reads a batch at a time, in memory).
    ``ends``: the absolute path of a rank's first file -> the sends whose communication ends at
    their partner's receive (:func:`~overlapprof.analysis.rank.events.ends_at_peer`). ``budget``:
    the bytes of rows the rank's :class:`~overlapprof.analysis.engine.store.Store` keeps in
    memory (None: all; 0: none). ``op_shapes``: keep the host ops with their input shapes from
    the same read (Kineto traces; :mod:`~overlapprof.analysis.rank.op_shapes`). Errors come back
    in ``error``."""
    result = RankResult(files=[str(f) for f in files])
    ends = ends.get(os.path.abspath(files[0])) if ends else None
    label = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} files)"
    comm_re, comm_ann = compile_comm_kernels(options.comm_kernels), compile_comm_annotations(options.comm_backends)
    exports = any(nsys.is_sqlite(f) for f in files)
    parallel = None
    if decode_workers > 1 and any(engine.may_split(f) for f in files):
        from overlapprof.analysis.engine.parallel import Reader  # a small rank needs no pool

        parallel = Reader(decode_workers, range_pool)
    try:
        if exports and options.like_hta:
            raise InputError(f"{files[0]}: --like-hta reads Kineto traces only, not Nsight Systems exports")
        if not exports:
            with Store(budget, label) as store:
                ev = bounded.measure([str(f) for f in files], comm_re, comm_ann, options, label, store, parallel, ends,
                                     op_shapes, remeasure=options.crossrank)
            result.op_shapes, result.remeasure = ev.op_shapes, ev.remeasure
            heap.release(ev.events)  # the store's and the measuring's pages, before the per-operation data
        else:
            ev = rank_events(files, comm_re, records=options.comm_records or options.crossrank,
                             record_own_args=options.comm_records, comm_ann=comm_ann, parallel=parallel,
                             ends=ends, step_range=options.step_range,
                             rank_map=options.rank_map)
            result.warnings += ev.notes
        infos = [t.distributedInfo for t in ev.headers if t.distributedInfo is not None]
        ranks = {i.rank for i in infos if i.rank is not None}
        if len(ranks) > 1:
            raise InputError(f"{files[0]}: the files of one rank claim ranks {sorted(ranks)}")
        result.dist_rank = ranks.pop() if ranks else None
        result.world_size = next((i.world_size for i in infos if i.world_size is not None), None)
        result.backend = next((i.backend for i in infos if i.backend), None)
        base = result.base = next((t.baseTimeNanoseconds for t in ev.headers if t.baseTimeNanoseconds), None)
        if options.crossrank:
            result.crossrank_input = crossrank_input(ev.headers, base)
        bounds = ev.bounds if not exports else event_bounds(ev)
        result.window = recorded_window(bounds, base)
        if ev.unclassified:
            shown = ", ".join(f"{cat} ({n} events)" for cat, n in sorted(ev.unclassified.items()))
            measured = ("the device was not measured: its numbers are its host's (cpu_ops as compute)"
                        if ev.mode == "cpu" else "read in GPU mode")
            result.warnings.append(f"{label}: device activity of categories OVERLAP.md does not classify left out "
                                   f"({measured}): {shown}")
        result.lookalikes = ev.lookalikes
        if ev.negative_durations:
            result.warnings.append(f"{label}: {ev.negative_durations} events with a negative 'dur' count as zero-length")
        if not exports:
            result.warnings += ev.warnings
            unions, table, measured = ev.unions, ev.table, ev.interference
        else:
            apply_filters(ev, options, label, result.warnings)
            unions, table = rank_unions(ev), ev.comm_records
            spans = InterferenceBuilder(ev.steps, nest=ev.mode == "cpu")
            spans.add(ev.compute)
            measured = spans.result(unions.comm, ev.names)
            heap.release(ev.events)
        report = report_and_exposure(result, ev, unions, table, measured, options,
                                     parallel.both if parallel is not None else None)
        comm, exposed = unions.comm, None
        if result.crossrank_input is not None:
            exposed = unions.exposed
        unions = None  # the steps' unions (a run per operation at most) go before the operations are made
        if not exports and result.remeasure is None:
            ev.unions = None
        if options.like_hta:  # the rank's numbers as HolisticTraceAnalysis 0.5.0 computes them
            from overlapprof.analysis import like_hta

            with Store(budget, label) as store:
                report.metrics, result.hta_steps = like_hta.rank_metrics(files, store=store)
        report.world_size, report.backend = result.world_size, result.backend
        if ev.unclassified and ev.mode == "cpu":
            report.device_not_measured = dict(sorted(ev.unclassified.items()))
        m = report.metrics
        result.recording = (base, bounds, report.events, report.comm_events, report.compute_events, m.comm_us,
                            m.compute_us, m.memory_us)
        if result.crossrank_input is not None:
            result.crossrank_input.world_size = result.world_size
            result.crossrank_input.attach(table, comm, exposed, report.metrics.exposed_comm_us)
        result.report = report
    except OverlapprofError as exc:
        result.error = exc
    return result


def _run_groups(
    groups: list[TraceGroup], options: Options, workers: int | None, progress, warnings: list[str],
    dask_scheduler=None, ends: dict | None = None, budget: int | None = DEFAULT_MEMORY_BUDGET,
    op_shapes: bool = False, kept: Store | None = None,
) -> list[RankResult]:
    """Analyze each group: on a Dask cluster when a scheduler is given, else in worker
    processes when there are several and it pays; a single group decodes a large file in
    ``workers`` processes (``ends``, ``budget``, ``op_shapes``: see :func:`analyze_group`); ``kept``:
    the store that each result's kept compute spans go to as it arrives (:meth:`Remeasure.keep_in`)."""
    work = functools.partial(analyze_group, ends=ends, budget=budget, op_shapes=op_shapes)
    total = len(groups)
    sizes = [g.size for g in groups]
    if workers is None:
        workers = os.cpu_count() or 1
    jobs = [[str(f) for f in g.files] for g in groups]
    results: list[RankResult | None] = [None] * total
    done = 0

    def finish(k: int, result: RankResult) -> None:
        nonlocal done
        if kept is not None and result.remeasure is not None:
            result.remeasure.keep_in(kept)
        results[k], done = result, done + 1
        if progress:
            progress(done, total, jobs[k][0])

    if dask_scheduler is not None:
        from overlapprof.analysis.engine.pool import run_on_dask

        # The workers get absolute paths (their working folder is not this one); the report
        # names the files as they were given.
        def as_given(k: int, result: RankResult) -> None:
            result.files = jobs[k]
            if result.report is not None:
                result.report.files = jobs[k]
            finish(k, result)

        run_on_dask(dask_scheduler, work, [[os.path.abspath(p) for p in files] for files in jobs], sizes,
                    (options,), as_given, ranges=True)
        return results
    if workers > 1 and total > 1 and sum(sizes) >= PARALLEL_MIN_BYTES:
        from concurrent.futures import as_completed  # here: process pools cost import time that one rank does not need
        from concurrent.futures.process import BrokenProcessPool

        from overlapprof.analysis.engine.pool import forked

        # workers only decode and compute, so they do not depend on the parent's threads
        try:
            with forked(min(workers, total)) as pool:
                order = sorted(range(total), key=lambda k: -sizes[k])  # largest first: none starts last
                futures = {pool.submit(work, jobs[k], options): k for k in order}
                for future in as_completed(futures):
                    finish(futures[future], future.result())
        except (BrokenProcessPool, OSError) as exc:  # a worker died (out of memory?) or none could start
            warnings.append(f"worker processes failed ({exc.__class__.__name__}); the remaining ranks ran in this process")
    for k, files in enumerate(jobs):
        if results[k] is None:
            # one rank: its files are decoded by the workers (ranks in the pool decode alone)
            finish(k, work(files, options, decode_workers=workers) if total == 1 else work(files, options))
    return results


@dataclass
class Analyzed:
    """A report with what its causes and bounds were measured from, for the replay
    (:mod:`overlapprof.analysis.replay`): the cross-rank ``matching`` (None without one) and each
    rank's :class:`~overlapprof.analysis.exposure.inputs.ExposureInput`; ``op_shapes``: rank ->
    its files' host ops with their input shapes (:class:`~overlapprof.analysis.rank.op_shapes.OpRows`;
    asked by ``AnalyzeOptions.op_shapes``, else empty)."""

    report: Report
    matching: object | None
    inputs: dict[int, ExposureInput]
    op_shapes: dict = field(default_factory=dict)


def analyze(paths, options: AnalyzeOptions | None = None, **fields) -> Report:
    """Analyze PyTorch profiler traces; the numbers follow OVERLAP.md.

    ``paths``: a path or a list of trace files (``.json``/``.json.gz``), folders of traces, or
    ``overlapprof run`` directories. ``options``: an :class:`~overlapprof.analysis.options.AnalyzeOptions`
    (default: all its defaults); ``fields``: any of its fields as keywords, over ``options``
    (``analyze(paths, comms=False, workers=1)``).

    Raises an :class:`~overlapprof.errors.OverlapprofError` (one-line message naming the file and
    the problem) on bad input.
    """
    return analyze_with_inputs(paths, options, **fields).report


def analyze_with_inputs(paths, options: AnalyzeOptions | None = None, **fields) -> Analyzed:
    """:func:`analyze`, keeping the matching and the ranks' exposure inputs (:class:`Analyzed`)."""
    asked = replace(options, **fields) if options is not None else AnalyzeOptions(**fields)
    recorded = asked.recorded()
    workers, progress, dask_scheduler = asked.workers, asked.progress, asked.dask_scheduler
    inputs = discover(paths, cycle=recorded.cycle)
    warnings: list[str] = list(inputs.notes)
    budget = asked.budget_bytes()
    if asked.memory_budget is not None and all(nsys.is_sqlite(f) for g in inputs.groups for f in g.files):
        warnings.append("--memory-budget: Nsight Systems exports are measured in memory (SQLite reads their "
                        "rows a batch at a time)")
    # the compute spans the ranks kept to be measured again with their sends' ends (rank/remeasure.py);
    # at budget 0 too its folder is made only once a span comes
    with Store(None if budget is None else max(budget, 1), "the ranks' compute spans") as kept:
        results = _run_groups(inputs.groups, recorded, workers, progress, warnings, dask_scheduler, budget=budget,
                              op_shapes=asked.op_shapes, kept=kept)
        warnings += [w for r in results for w in r.warnings]
        warnings = list(dict.fromkeys(warnings))  # the ranks of one export say the same of it
        good = [(r, g) for r, g in zip(results, inputs.groups) if r.error is None]
        failed = [r for r in results if r.error is not None]
        if failed and (not recorded.allow_partial or not good):
            raise failed[0].error
        if spill := next((r.error for r in failed if isinstance(r.error, SpillError)), None):
            raise spill  # the machine's problem, not a bad trace's: no rank is skipped for it
        warnings += [f"skipped {r.error}" for r in failed]
        results, groups = [r for r, _ in good], [g for _, g in good]
        if (line := lookalikes_warning([r.lookalikes for r in results])) is not None:
            warnings.append(line)
        settle_ranks(results, groups)
        check_one_run(results)
        one_recording_each(results)
        cycles_of_one_recording(results)
        matching = []
        crossrank = _cross_rank(results, recorded, matching)
        if matching:
            crossrank = _ends_from_peers(results, groups, recorded, matching, crossrank, workers, warnings,
                                         dask_scheduler, budget)
    for share in (r.crossrank_input for r in results if r.crossrank_input is not None):
        share.ops = None  # the section is built: the Matching holds every rank's operations (a copy)
    heap.release(sum(r.report.events for r in results))
    if recorded.like_hta:
        from overlapprof.analysis import like_hta

        with Store(budget, "the ranks (--like-hta)") as store:
            like_hta.settle(results, store=store)
    ranks = sorted((r.report for r in results), key=lambda r: r.rank)
    run, metrics = None, []
    if inputs.run:
        from overlapprof.analysis.workload_metrics import workload_metrics
        from overlapprof.rundir.run_record import missing_ranks, to_builtins  # run directories only

        if missing := missing_ranks(inputs.run.world_size, {r.rank for r in ranks}):
            warnings.append(f"run.json: world_size {inputs.run.world_size} but no trace for ranks {missing}")
        run = to_builtins(inputs.run)
        metrics = workload_metrics(inputs.run)
    modes = {r.mode for r in ranks}
    if len(modes) > 1:
        cpu = [r.rank for r in ranks if r.mode == "cpu"]
        warnings.append(f"ranks {cpu} have no GPU kernels and are read in CPU mode, the others in GPU mode")
    if recorded.lanes:
        from overlapprof.analysis.lanes import place

        place(ranks, crossrank)
    report = Report(
        version=__version__,
        inputs=[str(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)],
        options=recorded,
        filters=[text for name, text in FILTER_TEXT.items() if getattr(recorded, name)]
        + ([f"--cycle {recorded.cycle}: each rank's profiler cycle {recorded.cycle} alone"] if recorded.cycle else []),
        ranks=ranks,
        summary=summarize(ranks),
        warnings=warnings,
        run=run,
        crossrank=crossrank,
        workload_metrics=metrics,
    )
    inputs = {r.report.rank: r.exposure_input for r in results if r.exposure_input is not None}
    if recorded.like_hta:
        inputs = {}  # the causes split overlapprof's exposed communication, not HTA's
        report.exposure_notes.append("--like-hta: the causes of exposure and the overlap bound are left out (they "
                                     "split overlapprof's exposed communication, not HolisticTraceAnalysis's)")
    report.exposure_notes += explain(report, inputs, matching[0] if matching and inputs else None, run,
                                     recorded.reference_bandwidth, recorded.comm_records)
    return Analyzed(report, matching[0] if matching else None, inputs,
                    {r.report.rank: r.op_shapes for r in results if r.op_shapes is not None})


def _ends_from_peers(results: list[RankResult], groups: list[TraceGroup], options: Options, matching: list, crossrank,
                     workers, warnings: list[str], dask_scheduler, budget: int | None = DEFAULT_MEMORY_BUDGET):
    """OVERLAP.md section 1: an async send matched to a receive its thread waited for ends by the
    receive's end. The ranks whose sends that cuts are measured again with those ends, from what
    their one read kept (:class:`~overlapprof.analysis.rank.remeasure.Remeasure`: every metric is
    still computed once, from the classified intervals), and the cross-rank section is built again
    from them; every CPU rank with send/recv gets its :class:`~overlapprof.report.PointToPoint`.
    ``results`` and ``matching`` (a list of one Matching) are updated in place; returns the
    cross-rank section (``crossrank``, or the one built again)."""
    from overlapprof.analysis.crossrank.transfer_ends import partner_ends

    found = partner_ends(matching[0], {r.report.rank for r in results if r.report.mode == "cpu"},
                         {r.report.rank: r.exposure_input.compute for r in results if r.exposure_input is not None})
    again = [k for k, r in enumerate(results) if r.report.rank in found.ends]
    for k in again:
        if (r := results[k]).remeasure is not None:
            measured_again(r, r.remeasure.again(found.ends[r.report.rank]), options)
    # an Nsight Systems export (read whole, nothing kept) is read again with the ends
    read = [k for k in again if results[k].remeasure is None]
    if read:
        ends = {os.path.abspath(results[k].files[0]): found.ends[results[k].report.rank] for k in read}
        fresh = _run_groups([groups[k] for k in read], options, workers, None, warnings, dask_scheduler, ends, budget)
        for k, new in zip(read, fresh):
            if new.error is not None:
                raise new.error
            old = results[k]
            new.report.rank, new.report.rank_source = old.report.rank, old.report.rank_source
            results[k] = new
    for r in results:
        r.remeasure = None
    if again:
        matching.clear()
        crossrank = _cross_rank(results, options, matching)
    for r in results:
        r.report.p2p = found.p2p.get(r.report.rank)
    return crossrank


def _cross_rank(results: list[RankResult], options: Options, matching_out: list | None = None):
    """The cross-rank section from the workers' shares, now that ranks are settled
    (``matching_out``: see :func:`~overlapprof.analysis.crossrank.section.build_crossrank`)."""
    if not options.crossrank:
        return None
    shares = []
    for r in results:
        if r.crossrank_input is not None:
            r.crossrank_input.rank = r.report.rank
            shares.append(r.crossrank_input)
    return build_crossrank(shares, align_clocks=options.align_clocks, matching_out=matching_out) if shares else None

