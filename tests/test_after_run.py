"""overlapprof.renderers.after_run: what follows `overlapprof run`, as a library call on real ring runs."""

from __future__ import annotations

import shutil

from overlapprof.renderers.after_run import analyze_runs
from overlapprof.renderers.tensorboard import SCALAR_DIR


def test_runs_are_analyzed_in_order_given_scalars_and_compared(runs, tmp_path):
    dirs = {}
    for variant, run_dir in runs.ring.items():
        dirs[variant] = shutil.copytree(run_dir, tmp_path / run_dir.name)
        shutil.rmtree(dirs[variant] / SCALAR_DIR)
    empty = tmp_path / "empty"
    empty.mkdir()
    shown, notes = [], []
    done = analyze_runs([("sync", dirs["sync"]), ("broken", empty), ("async", dirs["async"])],
                        on_report=lambda variant, run_dir, report: shown.append((variant, len(report.ranks))),
                        log=notes.append)
    assert shown == [("sync", 2), ("async", 2)]
    assert [r.variant for r in done.runs] == ["sync", "async"]
    assert len(notes) == 1 and notes[0].startswith(f"no analysis of {empty}: ") and done.notes == notes
    assert all((d / SCALAR_DIR / "rank1").is_dir() for d in dirs.values())
    c = done.comparison
    assert c.baseline == "sync" and [v.label for v in c.variants] == ["sync", "async"]
    assert c.variants[1].speedup == c.variants[0].step_us / c.variants[1].step_us


def test_one_run_has_no_comparison(runs):
    done = analyze_runs([("sync", runs.ring["sync"])], scalars=False)
    assert len(done.runs) == 1 and done.comparison is None and done.notes == []
