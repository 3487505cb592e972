"""``overlapprof run``: launch ranks, run a workload, record one trace per rank, analyze them."""

import os
import re
import sys
from pathlib import Path

import click

from overlapprof.cli.common import command, fail, note
from overlapprof.launch import sigint
from overlapprof.rundir.schedule import ProfilerSchedule

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SCHEDULE = ProfilerSchedule()  # the flags' defaults


def _nccl_debug(ctx, param, value):
    """``LEVEL`` or ``LEVEL:SUBSYS,...`` -> (level, subsystems)."""
    if not value:
        return "", ""
    level, _, subsys = value.partition(":")
    levels = ("VERSION", "WARN", "INFO", "TRACE")
    if level.upper() not in levels:
        raise click.BadParameter(f"{level!r} is not one of {', '.join(levels)}")
    return level.upper(), subsys.upper()


@command("run", context_settings={"show_default": True},
         epilog="Exit codes: 0 every run succeeded; 1 a run failed (its logs and traces are kept); 2 bad "
                "input (one 'Error: ...' line on stderr); 130 interrupted (Ctrl-C).")
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("workload_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--nproc", "--nproc-per-node", "nproc", type=click.IntRange(min=1), default=2,
              help="Ranks per node (a GPU each on CUDA).")
@click.option("--nnodes", type=click.IntRange(min=1), default=1,
              help="Nodes; run the same command on each with its --node-rank (needs --run-id "
                   "and --rdzv-endpoint).")
@click.option("--node-rank", type=click.IntRange(min=0), default=0,
              help="This node's rank, 0 to nnodes-1; its ranks are node_rank*nproc + local rank.")
@click.option("--rdzv-endpoint", default="", metavar="HOST:PORT", show_default=False,
              help="Multi-node: address where node 0 hosts the rendezvous store (torchrun's "
                   "--master-addr:--master-port). Single node: a free port on localhost.")
@click.option("--run-id", default="", metavar="ID", show_default=False,
              help="Name the run directories <out>/<ID>-<variant> (else "
                   "<workload>-<date>-<time>-<variant>); the same on every node.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              help="auto: cuda when there is a GPU per rank, else cpu.")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto",
              help="auto: nccl on cuda, gloo on cpu.")
@click.option("--link-rate", default="", metavar="RATE", show_default=False,
              help="CPU, one node: run in a private network namespace whose loopback is paced "
                   "to RATE (tc spelling: 500mbit, 2gbit, 10gbit), emulating a network link; "
                   "one medium shared by all ranks, not a port per rank.")
@click.option("--link-burst", type=click.IntRange(min=1), default=None, metavar="BYTES",
              show_default=False,
              help="With --link-rate: tbf's burst, above the loopback MTU (65536). Default: half a millisecond of the link, at least 131072.")
@click.option("--link-latency", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="MS", show_default=False,
              help="With --link-rate: how long tbf queues a packet before dropping it. Default 100.")
@click.option("--nccl-debug", callback=_nccl_debug, default="", metavar="LEVEL[:SUBSYS,...]",
              show_default=False,
              help="Set NCCL_DEBUG (and NCCL_DEBUG_SUBSYS) for the ranks, e.g. INFO or "
                   "INFO:INIT,COLL; NCCL's log lines land in logs/rank<N>.stdout.log.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=300.0,
              metavar="SECONDS",
              help="Longest a rank may make no progress in its workload (one call, wait or phase), and "
                   "the longest the workload file's import may take; a hung run ends then, naming the call.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=_SCHEDULE.warmup_steps,
              help="Unprofiled steps first (NCCL builds communicators; first recv blocks).")
@click.option("--wait", type=click.IntRange(min=0), default=_SCHEDULE.wait,
              help="Profiler schedule: steps skipped at the start of each cycle.")
@click.option("--warmup", type=click.IntRange(min=0), default=_SCHEDULE.warmup,
              help="Profiler schedule: steps traced but discarded before the active ones.")
@click.option("--active", type=click.IntRange(min=1), default=_SCHEDULE.active,
              help="Profiler schedule: steps recorded per cycle. Each cycle starts with as "
                   "many steps with the profiler off, the baseline of its overhead.")
@click.option("--repeat", type=click.IntRange(min=1), default=_SCHEDULE.repeat,
              help="Profiler schedule: cycles, one trace file per rank each.")
@click.option("--variant", "variants", multiple=True, metavar="NAME",
              help="Variant to run (repeatable: one run directory each). Default: the "
                   "workload's default variant.")
@click.option("--list-variants", is_flag=True,
              help="Show the workload's variants and options, and exit.")
@click.option("--opt", "opts", multiple=True, metavar="KEY=VALUE",
              help="A workload option (repeatable); also accepted after --, as --key value.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("traces"),
              help="Folder of the run directories.")
@click.option("--gzip", is_flag=True, help="Write traces as .pt.trace.json.gz.")
@click.option("--with-stack", is_flag=True,
              help="Record Python stacks in the traces (costly: off by default).")
@click.option("--no-analyze", is_flag=True, help="Do not analyze the traces at the end.")
@click.option("--predict-from", "predict_from", type=click.Path(path_type=str), default=None, metavar="RUN",
              show_default=False,
              help="Predict this run's step from the traced RUN with the change --set names, before running it "
                   "(as `overlapprof whatif RUN --set CHANGE`), then check the prediction against it (as --check).")
@click.option("--set", "changes", multiple=True, metavar="NAME=VALUE[,NAME=VALUE]",
              help="With --predict-from: the change this run makes to RUN's configuration (one).")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress lines or heartbeat on stderr (errors and the ranks' own output "
                   "still show).")
def run(workload, workload_args, nproc, nnodes, node_rank, rdzv_endpoint, run_id, device,
        backend, link_rate, link_burst, link_latency, nccl_debug, timeout_s, warmup_steps, wait,
        warmup, active, repeat, variants, list_variants, opts, out, gzip, with_stack, no_analyze, predict_from, changes,
        quiet):
    """Run WORKLOAD (a workload .py file) on --nproc ranks per node and record a profiler trace
    per rank, then print its overlap report; with several --variant, their comparison, and each
    variant a change makes from the first predicted by replaying its steps, beside its run.
    Workload options go after -- (e.g. `overlapprof run workloads/ring.py --nproc 4 -- --size
    512`) or as --opt key=value.
    """
    if nnodes > 1 and not (run_id and rdzv_endpoint):
        fail("--nnodes > 1 needs --run-id (the shared run directory name) and "
                               "--rdzv-endpoint (node 0's HOST:PORT)")
    if node_rank >= nnodes:
        fail(f"--node-rank {node_rank} is not below --nnodes {nnodes}")
    if run_id and not _RUN_ID.match(run_id):
        fail(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-'")
    if (link_burst or link_latency) and not link_rate:
        fail("--link-burst and --link-latency need --link-rate")
    if bool(predict_from) != bool(changes) or len(changes) > 1:
        fail("--predict-from RUN and --set CHANGE go together, one change: the one this run makes to RUN's")
    with sigint.remembered():  # Ctrl-C while torch is imported: some import ignores KeyboardInterrupt
        if not list_variants and (not link_rate or _inside_link()):  # this process launches the ranks
            from overlapprof.launch import forkserver

            forkserver.start()  # its import of torch for the ranks runs beside this one's
        import torch  # noqa: F401  (slow: after the cheap checks, and not counted in the workload's --timeout)

        from overlapprof.launch import launcher
    sigint.raise_if_seen()

    loaded = launcher.load_workload(workload, timeout_s)
    if list_variants:
        click.echo(loaded.describe())
        return
    request = launcher.RunRequest(
        workload=loaded, variants=loaded.check_variants(variants),
        options=loaded.resolve_options(opts, workload_args), nproc=nproc, nnodes=nnodes,
        node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, run_id=run_id, device=device,
        backend=backend, nccl_debug=nccl_debug[0], nccl_debug_subsys=nccl_debug[1],
        timeout_s=timeout_s, schedule=ProfilerSchedule(warmup_steps=warmup_steps, wait=wait, warmup=warmup,
                                                       active=active, repeat=repeat),
        with_stack=with_stack, gzip=gzip, out=out,
        quiet=quiet)
    if link_rate:  # re-executes this command in a network namespace with a paced loopback
        from overlapprof.launch import netns

        request.link, code = netns.prepare(request, link_rate, sys.argv[1:], link_burst, link_latency)
        if code is not None:
            sys.exit(code)
    predicted = _predict(predict_from, changes[0], quiet) if predict_from else None
    results = launcher.run(request, log=(lambda line: None) if quiet else None)
    if predicted is not None:
        _check(predicted, [r.run_dir for r in results if r.ok])
    if not no_analyze:  # tables, TensorBoard scalars, and the comparison of several variants
        _after_run([(r.variant, r.run_dir) for r in results if r.ok], quiet)
    failed = next((r for r in results if not r.ok), None)
    kept = failed is not None and ("logs and traces" if failed.has_traces else "logs (no trace was written)")
    if failed is not None and failed.interrupted:
        click.echo(f"Error: {loaded.name}/{failed.variant} interrupted; {kept} kept in {failed.run_dir}",
                   err=True)
        # Everything is written (atomically). A Ctrl-C that landed in Python code run from C
        # (PyRun_String, during start-up) leaves CPython marked "unhandled KeyboardInterrupt",
        # which would turn this exit into a death by SIGINT (-2) at interpreter shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    if failed is not None:
        fail(f"{loaded.name}/{failed.variant} failed: {failed.failure_line()}; "
             f"{kept} kept in {failed.run_dir}", exit_code=1)
    _end_process()


def _inside_link() -> bool:
    """Whether this is the run that --link-rate re-executed inside its network namespace."""
    from overlapprof.launch import netns

    return netns.inside() is not None


def _end_process():
    """End the command's process now that everything is written and printed: the interpreter's
    teardown after torch (imported to launch) took ~0.35 s (measured), after the command's last
    line. Only where this is the command's own process: invoked in another program's (click's
    test runner, which replaces sys.stdout), the command returns to it."""
    if sys.stdout is not sys.__stdout__:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)



def _predict(run_dir: str, change: str, quiet: bool):
    """``overlapprof whatif RUN_DIR --set CHANGE``, printed before the run (its WhatIf)."""
    from overlapprof.analysis.replay.predict import whatif
    from overlapprof.renderers import whatif_table

    note(f"predicting {change} from {run_dir}", quiet)
    predicted = whatif([run_dir], [change])
    click.echo(f"prediction, before the run:\n{whatif_table.render(predicted)}", nl=False)
    if not predicted.predictions[0].modelled:
        fail(predicted.predictions[0].reason)
    return predicted


def _check(predicted, run_dirs) -> None:
    """The prediction against each run made (``whatif --check``)."""
    from overlapprof.analysis.replay.predict import check_saved
    from overlapprof.renderers.whatif_table import check_lines

    for run_dir in run_dirs:
        check_saved(predicted, str(run_dir))
        click.echo(check_lines(predicted.predictions[0]), nl=False)


def _after_run(runs, quiet: bool = False) -> None:
    """Print each run's table as it is analyzed, then the comparison (overlapprof.renderers.after_run)."""
    from overlapprof.renderers.after_run import analyze_runs
    from overlapprof.renderers import compare_table, table

    def show(variant, run_dir, report):
        click.echo(f"\n{variant}: {run_dir}\n{table.render(report)}", nl=False)

    done = analyze_runs(runs, on_report=show, log=lambda line: note(line, quiet))
    if done.comparison is not None:  # its own warnings end its table
        click.echo(f"\ncomparison ({len(done.runs)} variants, baseline {done.comparison.baseline}):\n"
                   f"{compare_table.render(done.comparison, report_warnings=False)}", nl=False)
        _replayed(done, quiet)


def _replayed(done, quiet: bool) -> None:
    """Each variant a change makes from the baseline's (the sync ring's async: ``async=send_recv``),
    predicted by replaying the baseline's traced steps, then checked against its run (as
    ``whatif BASELINE --set CHANGE`` beside ``compare``)."""
    from overlapprof.analysis.replay.predict import beside, whatif
    from overlapprof.errors import OverlapprofError
    from overlapprof.launch.rerun import variant_change
    from overlapprof.renderers.whatif_table import beside as lines

    base = done.runs[0]
    workload = ((base.report.run or {}).get("workload") or {}).get("name")
    wanted = {r.variant: change for r in done.runs[1:]
              if (change := variant_change(workload, base.variant, r.variant)) is not None}
    if not wanted:
        return
    try:
        predicted = whatif([str(base.run_dir)], list(dict.fromkeys(wanted.values())))
    except OverlapprofError as exc:
        note(f"no replay of {base.run_dir}: {exc}", quiet)
        return
    except Exception as exc:  # noqa: BLE001 - the runs are made and compared: a replay's fault ends nothing
        note(f"no replay of {base.run_dir}: {type(exc).__name__}: {exc} (please report it)", quiet)
        return
    shown = [b for b in beside(predicted, done.comparison.variants) if wanted.get(b.variant) == b.change]
    for p in predicted.predictions:
        if not p.modelled:
            note(f"no prediction of {p.change} from {base.variant}: {p.reason}", quiet)
    if shown:
        click.echo("predicted by replaying the baseline's steps, then run:\n" + lines(shown), nl=False)
