"""``bucket_cap_mb`` over a paced link: a new bucket that moves alone beside more compute than the
traced buckets had is charged the trace's interference rate for it
(overlapprof/analysis/replay/buckets.py, ``_slowed``), on a hand-made trace with the answer
worked out in the docstring."""

from __future__ import annotations

import json

import pytest

from overlapprof.analysis.advise.replayer import Replayer

import synthetic as S

MIB = 1 << 20
BESIDE = (0, 100, 200, 300, 200, 100)  # µs each rank computes beside each bucket, step by step


def _bucket(at, dur):
    """An async all_reduce of 1000 float32 (4000 bytes) on gloo's worker, issued at ``at``."""
    return [S.cpu_op("c10d::allreduce_", at, 1),
            S.annotation("gloo:all_reduce", at, dur, tid=200, args={"Input Dims": [[1000]], "Input type": ["float"]})]


def _step(n, base, beside):
    """400 µs of backward, a bucket, 400 µs more, a bucket, 300 µs of optimizer; each rank
    computes ``beside`` µs beside each bucket right after issuing it, then waits for it. Each
    bucket takes 200 µs + 0.5 × the two ranks' compute beside it."""
    x = 200 + beside
    t1 = base + 400 + x
    out = [S.step(n, base, 1100 + 2 * x), S.cpu_op("aten::mm", base, 400), *_bucket(base + 400, x),
           S.cpu_op("aten::mm", t1, 400), *_bucket(t1 + 400, x), S.cpu_op("aten::mm", t1 + 400 + x, 300)]
    if beside:
        out += [S.cpu_op("aten::mm", base + 401, beside), S.cpu_op("aten::mm", t1 + 401, beside)]
    return out, 1100 + 2 * x


def _run(folder):
    """Both ranks on one host of 8 cores (not crowded), sharing an 8 Gbit/s link."""
    folder.mkdir()
    events, base = [], 0
    for n, beside in enumerate(BESIDE, 1):
        ev, dur = _step(n, base, beside)
        events += ev
        base += dur
    for rank in (0, 1):
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    (folder / "run.json").write_text(json.dumps({
        "schema_version": 1, "world_size": 2, "device": "cpu",
        "nodes": {"0": {"node_rank": 0, "host": "h", "cpu_cores": 8, "nproc": 2}},
        "ranks": {str(r): {"rank": r, "node_rank": 0, "traces": [f"rank{r}.1.pt.trace.json"]} for r in (0, 1)},
        "link": {"bits_per_s": 8e9, "shared": True, "rate": "8gbit", "burst_bytes": 131072}}))
    return str(folder)


def test_over_a_link_a_new_bucket_alone_beside_backward_is_charged_the_traced_rate(tmp_path):
    """The interference fit: transfer = 200 µs + 0.5 × the compute beside it (exact, 12
    instances); the latency 200 µs (the shortest transfer: 4000 bytes take 8 µs on the link).
    Step 1 had nothing beside its buckets: 0 µs a byte beyond the latency. Split into buckets of
    2000 bytes, issued at work 200, 400, 600 and 800 as backward produces the gradients, waited at
    800, one at a time (as traced): the first moves alone for 200 µs of both ranks' backward
    (until the second's issue), 0.5 × 400 = 200 µs more, at most one rank's 200: 400 µs, ending at
    600; the others move after the next one's issue (gloo's second thread would keep the link
    busy) and are not charged: 200 µs each, the last ending at 1200, and the step 1200 + 300 of
    optimizer = 1500 (1300 uncharged)."""
    rp = Replayer([_run(tmp_path / "link")], workers=1)
    assert any("0.500 x the compute beside it" in n for n in rp.interference_notes)
    split = rp.predict(f"bucket_cap_mb={2000 / MIB!r}")
    assert split.prediction.modelled
    assert split.pairs[(0, 0)] == pytest.approx(1500, abs=1)
    assert split.pairs[(1, 0)] == pytest.approx(1500, abs=1)
