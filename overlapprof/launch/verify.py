"""``overlapprof advise RUN --verify``: rerun the workload of a run of ``overlapprof run`` with
the advised changes, and put what the replay predicted beside what the reruns measured.

Each change set becomes a rerun as :mod:`overlapprof.launch.rerun` says (or is refused, with its
reason, before anything runs). :func:`verify` predicts each change set with the replay
(:mod:`overlapprof.analysis.replay`), reruns the traced configuration (the baseline) and each set,
the top K changes one at a time and all together, with the baseline's rerun in the middle of the
sequence so the machine's load moves it as it moves the changed ones; each rerun is ``overlapprof
run`` in a child process (the launcher, and ``--link-rate``'s namespace, as a user's command would
use them: :func:`~overlapprof.launch.rerun.command` is that command). Each changed rerun is
compared with the baseline's as ``overlapprof compare`` does (:func:`overlapprof.compare.compare`:
median step over the (rank, step) pairs, the speedup's 95% bootstrap interval, and whether the
machine's load moved enough to explain it). Runs go to ``out`` (default: ``<run>-verify`` beside
the run), with ``verification.json``, rewritten after each rerun so a failed one keeps what was
measured before it.

This module launches (the launching side) and reads the runs back (it imports the reading side;
tests/test_architecture.py allows this one module both).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable

from overlapprof.errors import LaunchError
from overlapprof.launch.rerun import baseline_request, command, plan_rerun
from overlapprof.report.advice import TriedSet, Verification

RESULT = "verification.json"


class VerifyFailed(LaunchError):
    """A rerun failed: the message is one line; ``verification`` holds what was measured before
    (also in ``<out>/verification.json``). Exit code 1: the run failed, not the input."""

    exit_code = 1

    def __init__(self, message: str, verification: Verification):
        super().__init__(message)
        self.verification = verification


def _rerun(request, run_id: str, label: str, where: str, progress) -> Path:
    run_dir = Path(request.out) / f"{run_id}-{request.variants[0]}"
    log = Path(request.out) / f"{run_id}.log"
    progress(f"{where} {label}: running ({run_dir})")
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.run(command(request, run_id), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        said = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        line = next((ln for ln in reversed(said) if ln.startswith("Error:")), said[-1] if said else "no output")
        raise _Failed(f"{line.removeprefix('Error: ')} (exit {proc.returncode}; its output in {log})")
    progress(f"{where} {label}: done in {time.monotonic() - started:.0f} s")
    return run_dir


class _Failed(Exception):
    pass


def _steps(report) -> list[float]:
    return [s.step_us for r in report.ranks for s in r.steps]


def verify(run_dir: Path, changes: list[str], *, top: int, out: Path | None,
           progress: Callable[[str], None]) -> Verification:
    """Rerun ``run_dir``'s configuration and the first ``top`` of ``changes`` one at a time and
    all together (one set when ``top`` is 1), and compare each with the baseline's rerun (see the
    module docstring). Raises an OverlapprofError (one line) before any rerun when a change cannot
    be rerun or the run cannot be read, and :class:`VerifyFailed` when a rerun fails."""
    from overlapprof.analysis.analyzer import analyze
    from overlapprof.analysis.replay.predict import whatif
    from overlapprof.analysis.stats import median, percentile
    from overlapprof.compare import compare
    from overlapprof.errors import InputError

    run_dir = Path(run_dir)
    chosen = list(changes[:max(top, 1)])
    if not chosen:
        raise InputError("--verify: no change to verify")
    sets = [[c] for c in chosen] + ([chosen] if len(chosen) > 1 else [])
    plans = [plan_rerun(run_dir, ",".join(s)) for s in sets]
    for s, plan in zip(sets, plans):
        if isinstance(plan, str):
            raise InputError(f"--verify cannot rerun {','.join(s)}: {plan}")
    base = baseline_request(run_dir)
    out = Path(out) if out is not None else run_dir.parent / f"{run_dir.name}-verify"
    out.mkdir(parents=True, exist_ok=True)
    progress(f"predicting {len(sets)} change set{'s' if len(sets) > 1 else ''} from {run_dir}")
    predicted = whatif([str(run_dir)], [",".join(plan.replayed) for plan in plans], workers=1)
    result = Verification(traced_step_us=predicted.traced_step_us)
    tried = [TriedSet(changes=[], predicted_step_us=predicted.traced_step_us,
                      note="the traced configuration, rerun: the baseline of the speedups")]
    for s, p, plan in zip(sets, predicted.predictions, plans):
        notes = list(plan.notes) + ([] if p.modelled else [f"not predicted: {p.reason}"])
        tried.append(TriedSet(changes=list(s), predicted_step_us=p.step_us, predicted_low_us=p.low_us,
                              predicted_high_us=p.high_us, note="; ".join(notes) or None))
    requests = [base] + [plan.request for plan in plans]
    for r in requests:
        r.out = out
    half = len(sets) // 2  # the baseline in the middle: the load moves it as it moves the others
    order = [*range(1, 1 + half), 0, *range(1 + half, len(requests))]
    stamp = time.strftime("%H%M%S")
    run_ids = {k: f"{stamp}-{'baseline' if k == 0 else f'set{k}'}" for k in order}
    reports = {}
    for n, k in enumerate(order, 1):
        label = "baseline" if k == 0 else ",".join(tried[k].changes)
        try:
            rerun = _rerun(requests[k], run_ids[k], label, f"[{n}/{len(order)}]", progress)
        except _Failed as exc:
            _note(tried[k], f"rerun failed: {exc}")
            result.sets = tried
            _save(result, out)
            raise VerifyFailed(f"--verify: the rerun of {label} failed: {exc}; what was measured before is in "
                               f"{out / RESULT}", result) from None
        tried[k].run = str(rerun)
        reports[k] = analyze([str(rerun)], workers=1)
        steps = _steps(reports[k])
        if steps:
            t = tried[k]
            t.realized_step_us, t.realized_low_us, t.realized_high_us = \
                median(steps), percentile(steps, 2.5), percentile(steps, 97.5)
            if t.predicted_low_us is not None and t.predicted_high_us is not None:
                t.within = t.predicted_low_us <= t.realized_step_us <= t.predicted_high_us
        if 0 in reports:
            if k == 0:
                _drift(tried[0], result.traced_step_us)
            for j in [j for j in reports if j != 0 and tried[j].speedup is None]:
                _against(tried[j], reports[0], reports[j], compare, result.traced_step_us)
        result.sets = tried
        _save(result, out)
    return result


def _note(t: TriedSet, line: str) -> None:
    t.note = "; ".join(filter(None, [t.note, line]))


DRIFT = 0.10  # a baseline rerun this far from the traced step says the machine changed between them


def _drift(base: TriedSet, traced_us: float | None) -> None:
    """Say when the baseline's rerun is far from the traced step: the predicted steps (from the
    traced run) then cannot match the reruns' steps, and the speedups are what to judge."""
    if traced_us and base.realized_step_us and abs(base.realized_step_us / traced_us - 1) > DRIFT:
        _note(base, f"the rerun took {base.realized_step_us / traced_us:.2f}x the traced step: the machine (its load) "
                    "changed since the trace; judge the changes by their speedups against this rerun")


def _against(t: TriedSet, base_report, report, compare, traced_us: float | None) -> None:
    """The speedup of ``report``'s steps against the baseline rerun's, as ``compare`` gives it,
    and whether the predicted speedup (traced step / predicted step) lies in its interval."""
    v = compare([base_report, report], labels=["baseline", "changed"]).variants[1]
    t.speedup = v.speedup
    if v.speedup_ci is not None:
        t.speedup_low, t.speedup_high = v.speedup_ci
        if traced_us and t.predicted_step_us:
            predicted = traced_us / t.predicted_step_us
            inside = t.speedup_low <= predicted <= t.speedup_high
            _note(t, f"predicted speedup {predicted:.2f}x: {'inside' if inside else 'outside'} the realized one's "
                     f"interval")
    if "speedup" in v.not_trusted:
        _note(t, "speedup not trusted: the machine's load moved enough between the baseline's rerun and this one "
                 "to explain it")


def _save(result: Verification, out: Path) -> None:
    import msgspec

    (out / RESULT).write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
