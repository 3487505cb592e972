"""Over loopback, a hop's latency and the fastest copy from the trace's own fits
(``replay/copying.py``), the test VM's constants only where the trace cannot show them."""

from __future__ import annotations

import json

import pytest

from overlapprof.analysis.replay import copying
from overlapprof.analysis.replay.predict import _load, prepare, whatif

import synthetic as S


def _blocking(kind, at, dur, numel):
    """A blocking ``kind`` of ``numel`` floats on the main thread."""
    call = {"all_reduce": "allreduce_", "all_gather": "allgather_"}[kind]
    return [S.cpu_op(f"c10d::{call}", at, dur),
            S.annotation(f"gloo:{kind}", at, dur, args={"Input Dims": [[numel]], "Input type": ["float"]})]


def _steps(sizes):
    """4 steps: 400 µs of compute, a blocking all_reduce (``sizes[k % 2]``: (µs, floats)), a
    blocking 110 µs all_gather of 64 KiB, 300 µs of compute."""
    events, base = [], 0
    for k in range(4):
        ar, numel = sizes[k % 2]
        length = 400 + ar + 110 + 300
        events += [S.step(k + 1, base, length), S.cpu_op("aten::mm", base, 400),
                   *_blocking("all_reduce", base + 400, ar, numel), *_blocking("all_gather", base + 400 + ar, 110, 16384),
                   S.cpu_op("aten::mm", base + 510 + ar, 300)]
        base += length
    return events


def _write(folder, events):
    folder.mkdir()
    for r in (0, 1):
        S.write(folder / f"rank{r}.1.pt.trace.json", S.trace(events, rank=r, world_size=2, backend="gloo"))
    (folder / "run.json").write_text(json.dumps({
        "schema_version": 1, "world_size": 2, "device": "cpu",
        "nodes": {"0": {"node_rank": 0, "host": "h", "cpu_cores": 2, "nproc": 2}},
        "ranks": {str(r): {"rank": r, "node_rank": 0, "traces": [f"rank{r}.1.pt.trace.json"]} for r in (0, 1)}}))
    return str(folder)


def test_a_fitted_kind_gives_the_hop_latency_and_the_copy_rate_of_a_kind_of_one_size(tmp_path):
    """The all_reduces of 64 KiB take 150 µs and of 128 KiB 200 µs: 100 µs latency over its 2
    hops (50 µs a hop) + 50 µs per 64 KiB of bus bytes, a copy of 2 × 65536 bytes in 50 µs
    (2621.44 bytes a µs). The all_gather has one size: its 128 KiB copied (64 KiB of bus bytes,
    sent and received) take its 110 µs less one hop's 50 µs: 60 µs (the test VM's 60 µs would
    leave 50). async=all_gather moves the 300 µs of compute beside it, charged those 60 µs: steps
    of 400 + 150 or 200 + 360, median 935 µs (traced 985)."""
    path = _write(tmp_path / "fitted", _steps([(150, 16384), (200, 32768)]))
    analyzed, tr = _load([path], workers=1)
    prepared = prepare(analyzed.report, tr)
    hop = copying.loopback_hop(prepared.model)
    assert hop.us == pytest.approx(50) and hop.rate == pytest.approx(2 * 65536 / 50) and not hop.assumed
    gather = (1, 2)  # all_gather on 2 ranks
    assert copying.rates(tr, prepared.model)[gather] == pytest.approx(2 * 65536 / 60)
    result = whatif([path], ["async=all_gather"], workers=1)
    fits = {f.kind: f for f in result.transfer}
    assert fits["all_reduce"].source == "fit" and fits["all_gather"].latency_us == pytest.approx(50)
    assert "loopback: a hop's latency 50 us and a copy at most 2.62 GB/s, from the trace's fits of all_reduce on " \
           "2 ranks (2 sizes)" in result.notes
    assert any("all_gather on 2 ranks over loopback: latency 50 us (50 us a hop" in n for n in result.notes)
    got = result.predictions[0]
    assert result.traced_step_us == pytest.approx(985)
    assert got.step_us == pytest.approx(935)
    assert any("charged the copying it is moved beside: +0.060 ms a step" in n for n in got.notes)


def test_a_trace_of_one_size_a_kind_says_the_constants_were_assumed(tmp_path):
    """Every all_reduce 150 µs for 64 KiB: no kind has two sizes, so the hop's latency (60 µs)
    and the copy ceiling (8 GB/s) are the test VM's, and the notes (whatif's, advise's words for
    the crowded cores) say they were assumed. The all_gather's copying is then 110 − 60 = 50 µs."""
    path = _write(tmp_path / "one", _steps([(150, 16384), (150, 16384)]))
    analyzed, tr = _load([path], workers=1)
    prepared = prepare(analyzed.report, tr)
    hop = copying.loopback_hop(prepared.model)
    assert (hop.us, hop.rate, hop.assumed) == (copying.HOP_US, copying.MAX_RATE, ("latency", "rate"))
    assert copying.rates(tr, prepared.model)[(1, 2)] == pytest.approx(2 * 65536 / 50)
    result = whatif([path], ["async=all_gather"], workers=1)
    assert any(n.startswith("loopback: a hop's latency 60 us and a copy at most 8 GB/s assumed (measured on "
                            "overlapprof's test VM): no kind of this trace has two or more sizes") for n in result.notes)
    assert {f.kind: f.latency_us for f in result.transfer} == {"all_reduce": pytest.approx(120),
                                                              "all_gather": pytest.approx(60)}
    assert "measured from its transfers; a hop's latency (60 us) and the copy ceiling (8 GB/s) assumed, the test VM's)" in \
        prepared.crowded[0].words()


def test_a_fit_through_the_origin_leaves_the_hop_latency_assumed():
    """A fit whose intercept fell below zero (refitted through the origin: latency 0) shows the
    copy rate, not the latency: the hop's latency is the fallback, and the words say which."""
    from overlapprof.analysis.replay.transfer import Model
    from overlapprof.report.whatif import TransferFit

    fit = TransferFit(kind="send_recv", group_size=2, operations=8, sizes=3, source="fit", latency_us=0.0,
                      bandwidth_gbps=1.5)
    hop = copying.loopback_hop(Model([fit], None, []))
    assert (hop.us, hop.rate, hop.assumed) == (copying.HOP_US, pytest.approx(1500.0), ("latency",))
    assert "a copy at most 1.50 GB/s from the trace's fits of send_recv on 2 ranks (3 sizes); a hop's latency 60 " \
           "us assumed" in hop.words
