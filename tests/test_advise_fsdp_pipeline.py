"""The advise bench's FSDP and pipeline cases (issue 37), on hand-made traces whose right advice is
known: FSDP's blocking all-gathers are advised as prefetching (the change a rerun of its async
variant makes), not as an async_op; a late rank of an `overlapprof run` run that its slow-rank
options do not slow (a pipeline's last stage computing the loss) is a hint without a number."""

from __future__ import annotations

import pytest

from overlapprof.analysis.advise import advise

import synthetic as S
from test_advise import _async, _compute, _host, _write
from test_advise_straggler import _late


def _gather(at, dur):
    """A blocking all_gather on the main thread (FSDP's sync variant: waited where issued)."""
    return [S.cpu_op("c10d::allgather_", at, dur),
            S.annotation("gloo:all_gather", at, dur, args={"Input Dims": [[1000]], "Input type": ["float"]})]


def _sync_fsdp():
    """Per step, three units: each a 200 µs blocking all_gather then 300 µs of compute (1500 µs).
    prefetch=1 issues each next gather where the one before it was: hidden under the unit before,
    1100 µs; prefetch=2 hides nothing more."""
    events, base = [], 0
    for k in range(4):
        events.append(S.step(k + 1, base, 1500))
        for u in range(3):
            events += [*_gather(base + 500 * u, 200), *_compute(f"unit{u + 1}", base + 500 * u + 200, 300)]
        base += 1500
    return events


def test_blocking_fsdp_all_gathers_are_advised_as_prefetching_not_async(tmp_path):
    events = _sync_fsdp()
    a = advise([_write(tmp_path / "fsdp", {0: events, 1: events})], workers=1)
    assert [i.change for i in a.items] == ["prefetch=1"]
    assert a.items[0].step_us == pytest.approx(1100, abs=5)
    assert not any(c.rule == "async" for c in [*a.items, *a.rejected, *a.hints])


def _fsdp2_on_gloo():
    """The same three units as FSDP2 issues them on gloo with ``_set_unshard_async_op`` (both
    variants of workloads/fsdp.py at prefetch 0): a 1 µs ``c10d::_allgather_base_`` issue, the
    200 µs transfer on gloo's worker thread, waited inside ``FSDP::all_gather_copy_out`` (no wait
    event of its own), then the unit's 300 µs of compute."""
    events, base = [], 0
    for k in range(4):
        events.append(S.step(k + 1, base, 1500))
        for u in range(3):
            at = base + 500 * u
            events += [*_async(at, 200, 1000, kind="all_gather", call="_allgather_base_"),
                       S.annotation(f"FSDP::all_gather_copy_out ({u})", at + 1, 199),
                       *_compute(f"unit{u + 1}", at + 200, 300)]
        base += 1500
    return events


@pytest.mark.parametrize("events", [_sync_fsdp, _fsdp2_on_gloo])
def test_fsdps_sync_variant_is_advised_what_its_async_variant_at_prefetch_0_is(tmp_path, events):
    """workloads/fsdp.py's sync variant and its async one at prefetch=0 run the same program (one
    trace here): advise predicts the same step from either, 1100 µs, and says the rerun that makes
    it (from the sync variant, its async one: the replay's prefetch is on top of the traced depth,
    0 in both; the sync run records the option's default, 1, which it does not use)."""
    trace = events()
    actions = {}
    for variant, prefetch in (("sync", 1), ("async", 0)):
        options = {"layers": 3, "prefetch": prefetch, "slow_rank": -1, "slow_ms": 0.0}
        run = {"workload": {"name": "fsdp"}, "variant": variant, "options": options, **_host(8)}
        a = advise([_write(tmp_path / variant, {0: trace, 1: trace}, run=run)], workers=1)
        assert [(i.change, i.step_us, i.saving_us) for i in a.items] == [
            ("prefetch=1", pytest.approx(1100, abs=5), pytest.approx(400, abs=5))]
        actions[variant] = a.items[0].action
    assert actions == {"sync": "rerun with --variant async --opt prefetch=1 (was 0: 1 more unit ahead)",
                       "async": "rerun with --opt prefetch=1 (was 0: 1 more unit ahead)"}


def _run(slow_rank, slow_ms):
    options = {"slow_rank": slow_rank, "slow_ms": slow_ms, "slow_compute": slow_ms > 0}
    return {"workload": {"name": "pipeline"}, "variant": "async", "options": options, **_host(8)}


def test_a_late_rank_a_rerun_cannot_speed_up_is_a_hint_without_a_number(tmp_path):
    """Rank 1 computes 1200 µs more in every step. Where the run's options slow no rank (the
    pipeline's last stage, which computes the loss), no rerun removes that work: a hint, no item;
    where they slow rank 1, dropping them is the listed change; a user's own job (no workload)
    gets it listed too."""
    late = _late([(400, 0, 1200)] * 4)
    own = advise([_write(tmp_path / "own", late, run=_run(-1, 0.0))], workers=1)
    assert not any(i.rule == "no_straggler" for i in own.items)
    hint = next(h for h in own.hints if h.rule == "no_straggler")
    assert hint.change == "no_straggler=1" and "not this run's slow rank (slow_rank=-1, slow_ms=0.0)" in hint.why
    assert "no option of a rerun removes" in hint.why
    planted = advise([_write(tmp_path / "planted", late, run=_run(1, 1.2))], workers=1)
    assert [i.change for i in planted.items if i.rule == "no_straggler"] == ["no_straggler=1"]
    users = advise([_write(tmp_path / "users", late, run=_host(8))], workers=1)
    assert [i.change for i in users.items if i.rule == "no_straggler"] == ["no_straggler=1"]


def test_a_small_message_inside_the_links_burst_is_charged_its_copying_not_its_latency(tmp_path):
    """pipeline-sync's trace: a 64 KiB message passes inside the link's 128 KiB burst (here a
    10 Gbit/s link), unpaced, in about one hop's latency. The link holds back none of its 130 µs,
    but its bytes' copying is 16 µs (at most 8000 bytes a µs, for the 128 KiB its 2 ranks' bus
    bytes put on the link): 13% the cores' work, not 100%, so making it asynchronous is listed
    (it was a hint), the 300 µs of compute moved beside it charged 13% of the 130 µs it hides."""
    events, base = [], 0
    for k in range(4):
        events += [S.step(k + 1, base, 830), *_compute("layer3", base, 400),
                   S.cpu_op("c10d::allreduce_", base + 400, 130),
                   S.annotation("gloo:all_reduce", base + 400, 130,
                                args={"Input Dims": [[16384]], "Input type": ["float"]}),
                   *_compute("layer4", base + 530, 300)]
        base += 830
    run = {**_host(2), "link": {"shared": True, "bits_per_s": 1e10, "burst_bytes": 128 * 1024}}
    a = advise([_write(tmp_path / "burst", {0: events, 1: events}, run=run)], workers=1)
    item = next(i for i in a.items if i.rule == "async")
    assert any("13% of its transfers' time is the cores' work (copying their bytes" in c for c in item.confidence)
    assert item.saving_us == pytest.approx(130 * (1 - 0.126), abs=3)


def _uneven_fsdp():
    """Per step, four units whose gathers take 100, 100, 100 and 370 µs and whose compute 300,
    300, 50 and 100 µs (1420 µs): the last gather is hidden only from two units ahead, so
    prefetch=2 gives 870 µs and prefetch=3 850, 20 µs shorter: under the 3% (42.6 µs) a deeper
    prefetch must save to be worth its memory."""
    events, base = [], 0
    for k in range(4):
        events.append(S.step(k + 1, base, 1420))
        at = base
        for u, (g, c) in enumerate(zip((100, 100, 100, 370), (300, 300, 50, 100))):
            events += [*_gather(at, g), *_compute(f"unit{u + 1}", at + g, c)]
            at += g + c
        base += 1420
    return events


def test_a_prefetch_depth_the_margin_ruled_out_is_not_offered_in_place_of_the_best(tmp_path):
    """When the best depth (prefetch=2, 550 µs saved) is not listable (under the floor) and
    prefetch=3 (570 µs) would be, prefetch=3 is not offered in its place: its 20 µs more were
    judged not worth a deeper prefetch."""
    from overlapprof.analysis.advise import facts as _facts, terms
    from overlapprof.analysis.advise.ranking import _best, _listable, _why_not
    from overlapprof.analysis.advise.replayer import Replayer
    from overlapprof.analysis.advise.rules import candidates

    events = _uneven_fsdp()
    rp = Replayer([_write(tmp_path / "fsdp", {0: events, 1: events})], workers=1)
    f = _facts.read(rp.report, rp.tr, rp.traced_step_us)
    f.said = terms.prepare(rp, f)
    prefetch = next(c for c in candidates(f, rp.tr, rp.model.fits, True, rp.one_bucket)[0] if c.rule == "prefetch")
    best = (prefetch, *_best(rp, [], rp.base, prefetch))
    assert best[1] == "prefetch=2" and best[3] == {"prefetch=1": pytest.approx(1170), "prefetch=2": pytest.approx(870),
                                                   "prefetch=3": pytest.approx(850)}
    # no compute ran beside the gathers: a saving needs twice the floor (docs/advise.md, rule 4)
    assert _why_not(rp, rp.base, best[2], floor=250) is None
    assert _listable(rp, [], rp.base, best, floor=250) is best
    assert _why_not(rp, rp.base, best[2], floor=280) is not None  # 550 < 560: not listable
    assert _why_not(rp, rp.base, rp.predict("prefetch=3"), floor=280) is None  # 570: would be
    assert _listable(rp, [], rp.base, best, floor=280) is best  # but is not offered in its place
