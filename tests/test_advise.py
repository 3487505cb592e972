"""``overlapprof advise`` (issue 37): each rule on a hand-made trace whose right advice is known,
the joint ranking of two causes (the second saving on top of the first), no advice where there
is nothing to change, a hint without a number for what the replay cannot model, the JSON round
trip, the CLI's one-line errors and --verify for a user's own job; and one real DDP run whose
single bucket holds every gradient."""

from __future__ import annotations

import json

import pytest

from overlapprof.analysis.advise import advise
from overlapprof.analysis.replay.predict import whatif
from overlapprof.report.advice import Advice

import synthetic as S
from conftest import REPO, SHORT_SCHEDULE, _overlapprof, overlapprof_here

MIB = 1 << 20


def _blocking(at, dur, numel=None):
    """A blocking all_reduce on the main thread (its size in the annotation when given)."""
    args = {"Input Dims": [[numel]], "Input type": ["float"]} if numel else None
    return [S.cpu_op("c10d::allreduce_", at, dur), S.annotation("gloo:all_reduce", at, dur, args=args)]


def _async(at, dur, numel, kind="all_reduce", call="allreduce_"):
    """An async operation: a 1 µs c10d call, its span on gloo's worker thread."""
    return [S.cpu_op(f"c10d::{call}", at, 1),
            S.annotation(f"gloo:{kind}", at, dur, tid=200, args={"Input Dims": [[numel]], "Input type": ["float"]})]


def _compute(name, at, dur):
    """``dur`` µs of compute inside a ``record_function(name)`` range."""
    return [S.annotation(name, at, dur), S.cpu_op("aten::mm", at, dur)]


def _write(folder, ranks, run=None):
    folder.mkdir()
    for rank, events in ranks.items():
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=len(ranks),
                                                                backend="gloo"))
    if run is not None:
        record = {"schema_version": 1, "world_size": len(ranks), "device": "cpu",
                  "ranks": {str(r): {"rank": r, "traces": [f"rank{r}.1.pt.trace.json"]} for r in ranks}, **run}
        (folder / "run.json").write_text(json.dumps(record))
    return str(folder)


def _plain_step(base, before=400, after=300):
    """compute ``layer3`` (before), a blocking 300 µs all_reduce, compute ``layer4`` (after)."""
    return [*_compute("layer3", base, before), *_blocking(base + before, 300),
            *_compute("layer4", base + before + 300, after)]


def _plain(tmp_path, name="plain", run=None):
    events = [S.step(1, 0, 1000), S.step(2, 1000, 1000), *_plain_step(0), *_plain_step(1000)]
    return _write(tmp_path / name, {0: events, 1: events}, run)


def _joint_ok(path, a: Advice):
    """Every item's step is the replay of its joint change, and the savings add up to it."""
    before = a.replayed_step_us
    for item in a.items:
        got = whatif([path], [item.joint_change], workers=1).predictions[0]
        assert item.step_us == pytest.approx(got.step_us) and (item.low_us, item.high_us) == pytest.approx(
            (got.low_us, got.high_us))
        assert item.saving_us == pytest.approx(before - item.step_us)
        before = item.step_us


def test_a_blocking_operation_is_made_async_and_its_wait_named(tmp_path):
    """400 µs of layer3, a blocking 300 µs all_reduce, 300 µs of layer4: made async and waited at
    the step's end, layer4 hides it: 700 µs, 0.3 ms saved."""
    path = _plain(tmp_path)
    a = advise([path], workers=1)
    assert a.verdict is None and [i.change for i in a.items] == ["async=all_reduce"]
    item = a.items[0]
    assert item.step_us == pytest.approx(700) and item.saving_us == pytest.approx(300)
    assert item.saving_low_us == pytest.approx(300) and item.speedup == pytest.approx(1000 / 700)
    assert "wait for all_reduce #1" in item.action and "after `layer4`" in item.action
    assert "not right after issuing it" in item.action and "async_op=True" in item.action
    assert "no_window 0.300 ms a step" in item.cause
    assert any("interference not modelled" in c for c in item.confidence)
    assert item.tried == {"async=all_reduce": pytest.approx(700), "async=all_reduce@end": pytest.approx(700)}
    _joint_ok(path, a)


def _buckets(base, sizes, compute_after):
    """DDP-like backward: ``layer`` compute, then each bucket issued as its gradients are
    produced (400 µs of compute apart), ``compute_after`` µs of compute, the wait."""
    events, t = [], base
    for k, numel in enumerate(sizes):
        events += _compute(f"layer{len(sizes) - k}", t, 400)
        t += 400
        events += _async(t, 600, numel)
        t += 1
    events += _compute("optimizer", t, compute_after)
    return events


def test_bucket_size_is_searched_and_the_best_kept(tmp_path):
    """Two 1 MiB buckets of 600 µs each, issued at 400 and 801, the second waited at 1401 after
    100 µs of compute: exposed window_short. Smaller buckets start earlier: the replay's best
    of the ladder is kept, and its action is DDP's argument (not a run of `overlapprof run`)."""
    events = [S.step(1, 0, 1401), *_buckets(0, [MIB // 4, MIB // 4], 100)]
    path = _write(tmp_path / "ddp", {0: events, 1: events})
    a = advise([path], workers=1)
    assert a.items and a.items[0].rule == "bucket_cap_mb", a
    item = a.items[0]
    mb = item.change.split("=")[1]
    assert set(item.tried) == {"bucket_cap_mb=0.25", "bucket_cap_mb=0.5", "bucket_cap_mb=1", "bucket_cap_mb=2"}
    assert item.step_us == min(item.tried.values()) < a.replayed_step_us
    assert float(mb) < 1 and item.action == f"DistributedDataParallel(model, bucket_cap_mb={mb})"
    assert "window_short" in item.cause
    _joint_ok(path, a)


def test_one_bucket_a_step_is_a_hint_without_a_number(tmp_path):
    """One all_reduce a step holds every gradient: where each is produced is not in the trace, so
    smaller buckets are a hint (no number), with the workload option of a run of `overlapprof run`."""
    events = [S.step(1, 0, 1001), S.step(2, 1001, 1001)]
    for base in (0, 1001):
        events += [*_compute("backward", base, 400), *_async(base + 400, 600, 2 * MIB // 4)]
    run = {"workload": {"name": "ddp", "path": str(REPO / "workloads/ddp.py")}, "variant": "async",
           "options": {"bucket_cap_mb": 100.0, "slow_rank": -1, "slow_ms": 0.0}}
    a = advise([_write(tmp_path / "one", {0: events, 1: events}, run)], workers=1)
    hint = next(h for h in a.hints if h.rule == "bucket_cap_mb")
    assert hint.action == "rerun with --opt bucket_cap_mb=0.5 (was 100)" and "one all_reduce a step" in hint.why
    assert not any(i.rule == "bucket_cap_mb" for i in a.items) and a.workload == "ddp"


def test_prefetch_deeper_for_fsdp_all_gathers(tmp_path):
    """FSDP-like forward (test_analysis_replay's): g3 issued when unit 2 starts, needed 100 µs
    before it ends: prefetch=1 hides it, 1200 -> 1100 µs."""
    g = lambda at, dur: _async(at, dur, 1000, "all_gather", "allgather_")  # noqa: E731
    events = [S.step(1, 0, 1200), *g(0, 200), *g(200, 200), *_compute("unit1", 201, 299),
              *g(500, 400), *_compute("unit2", 501, 299), *_compute("unit3", 900, 300)]
    path = _write(tmp_path / "fsdp", {0: events, 1: events})
    a = advise([path], workers=1)
    item = next(i for i in a.items if i.rule == "prefetch")
    assert item.change == "prefetch=1" and item.tried["prefetch=1"] == pytest.approx(1100)
    assert "set_modules_to_forward_prefetch" in item.action
    assert any("memory" in c for c in item.confidence)
    _joint_ok(path, a)


def test_a_straggler_is_named_with_what_it_was_doing(tmp_path):
    """Rank 1 computes 600 µs, not 400, before the all_reduce: rank 0 waits 200 µs a step for it."""
    fast = [S.step(1, 0, 1200), *_compute("layer3", 0, 400), S.cpu_op("c10d::allreduce_", 400, 500),
            S.annotation("gloo:all_reduce", 400, 500), *_compute("layer4", 900, 300)]
    slow = [S.step(1, 0, 1200), *_compute("layer3", 0, 600), *_blocking(600, 300), *_compute("layer4", 900, 300)]
    path = _write(tmp_path / "late", {0: fast, 1: slow})
    a = advise([path], workers=1)
    item = next(i for i in a.items if i.rule == "no_straggler")
    assert item.change == "no_straggler=1"
    assert item.action.startswith("rank 1 is late by 0.200 ms a step, 0.200 ms of it in compute: it computes longer")
    assert "others wait 0.200 ms a step for rank 1" in item.cause


def test_two_causes_ranked_by_joint_prediction(tmp_path):
    """Rank 1 computes 500 µs, rank 0 400, before a blocking all_reduce (300 µs once both are in),
    then 600 µs of layer4: 1400 µs a step, rank 0 waiting 100 µs for rank 1 (late_peer), both
    blocked 300 µs (no_window). Async alone: rank 0 1000 µs, rank 1 1100 (median 1050: saves
    350); the straggler alone saves 100; both: 1000. Ranked async first, the straggler second
    saves 50 on top of it, not the 100 it saves alone: the savings add up to the joint step."""
    def step(base, before, wait):
        return [*_compute("layer3", base, before), *_blocking(base + before, 300 + wait),
                *_compute("layer4", base + 800, 600)]

    fast = [S.step(1, 0, 1400), S.step(2, 1400, 1400), *step(0, 400, 100), *step(1400, 400, 100)]
    slow = [S.step(1, 0, 1400), S.step(2, 1400, 1400), *step(0, 500, 0), *step(1400, 500, 0)]
    path = _write(tmp_path / "two", {0: fast, 1: slow})
    a = advise([path], workers=1)
    assert [i.change for i in a.items] == ["async=all_reduce", "no_straggler=1"], a.items
    first, second = a.items
    assert second.joint_change == "async=all_reduce,no_straggler=1"
    assert (first.step_us, first.saving_us) == pytest.approx((1050, 350))
    assert (second.step_us, second.saving_us) == pytest.approx((1000, 50))
    _joint_ok(path, a)
    alone = whatif([path], ["no_straggler=1"], workers=1).predictions[0].step_us
    assert a.replayed_step_us - alone == pytest.approx(100)  # alone it would claim 100: counted once here
    assert first.saving_us + second.saving_us == pytest.approx(a.replayed_step_us - whatif(
        [path], ["async=all_reduce,no_straggler=1"], workers=1).predictions[0].step_us)
    assert advise([path], top=1, workers=1).items == [first]  # --top K: the first K of the same ranking


def test_nothing_to_change_and_no_communication_say_so_in_one_line(tmp_path):
    hidden = [S.step(1, 0, 1000), *_async(100, 300, 1000), *_compute("layer", 101, 899)]
    a = advise([_write(tmp_path / "hidden", {0: hidden, 1: hidden})], workers=1)
    assert not a.items and not a.hints  # the 1 µs c10d call before compute starts is all that is exposed
    assert a.verdict == "communication exposed 0.001 ms a step, 0.1% of the 1.000 ms step: nothing worth changing"
    alone = [S.step(1, 0, 1000), *_compute("layer", 0, 1000)]
    b = advise([_write(tmp_path / "alone", {0: alone, 1: alone})], workers=1)
    assert not b.items and b.verdict == "no communication in this run: nothing for overlap to hide, nothing to change"
    text = overlapprof_here("advise", tmp_path / "alone", "--workers", 1)
    assert text.exit_code == 0 and text.stdout.splitlines()[1] == f"{b.verdict}"


def _host_sync(transfer):
    """An async all_reduce of ``transfer`` µs issued at 400 while the main thread sits in a barrier
    [401, 700) (the ring's ``--opt host_sync`` on CPUs), 300 µs of layer4 after it."""
    return [S.step(1, 0, 1000), *_compute("layer3", 0, 400), *_async(400, transfer, 1000),
            S.cpu_op("c10d::barrier", 401, 299), S.annotation("gloo:barrier", 401, 299),
            *_compute("layer4", 700, 300)]


def test_a_host_synchronization_that_removing_saves_nothing_stays_a_hint_naming_it(tmp_path):
    """The all_reduce ends when the barrier does (300 µs): without the barrier the lane waits for
    it as long (nothing computes beside it), so no_host_sync saves nothing: not listed, the hint
    naming the call stays, with the replay's number."""
    events = _host_sync(300)
    a = advise([_write(tmp_path / "sync", {0: events, 1: events})], workers=1)
    hint = next(h for h in a.hints if h.rule == "host_sync")
    assert "`c10d::barrier` 0.299 ms a step" in hint.action and "host_blocked 0.299 ms a step" in hint.why
    assert not a.items and a.verdict.startswith("nothing worth changing: no change is predicted to save 3% or more")
    assert "removing the barriers is not predicted to save reliably (replayed: 1.000 ms" in hint.why
    assert [r.change for r in a.rejected] == ["no_host_sync"]


def test_a_barrier_holding_the_host_after_the_operation_ends_is_listed_removed(tmp_path):
    """The all_reduce (200 µs) ends at 600, the barrier holds the host to 700: removing it saves
    100 µs a step (a 900 µs step), listed with the host_sync action, and no hint for it."""
    events = _host_sync(200)
    run = {"workload": {"name": "ring", "path": str(REPO / "workloads/ring.py")}, "variant": "async",
           "options": {"host_sync": True, "slow_rank": -1, "slow_ms": 0.0}}
    a = advise([_write(tmp_path / "sync", {0: events, 1: events}, run)], workers=1)
    item = a.items[0]
    assert (item.rule, item.change, item.step_us, item.saving_us) == ("host_sync", "no_host_sync", 900, 100)
    assert item.action.startswith("move the host synchronization out of the communication's window")
    assert "`c10d::barrier`" in item.action and item.action.endswith("(this run: --opt host_sync=true: drop it)")
    assert item.cause.startswith("host_blocked") and not any(h.rule == "host_sync" for h in a.hints)


def test_json_round_trip_and_cli(tmp_path):
    path = _plain(tmp_path)
    got = overlapprof_here("advise", path, "--json", tmp_path / "a.json", "--workers", 1, "-q")
    assert got.exit_code == 0, got.output
    loaded = Advice.load(tmp_path / "a.json")
    assert loaded == Advice.from_json(loaded.to_json()) and loaded.items[0].change == "async=all_reduce"
    assert "1. wait for all_reduce #1" in got.stdout and "saves 0.300 ms a step" in got.stdout
    only = overlapprof_here("advise", path, "--json", "--workers", 1)
    assert Advice.from_json(only.stdout).items[0].step_us == pytest.approx(700)


@pytest.mark.parametrize("args, words", [
    (["missing-dir"], "missing-dir: no such file or directory"),
    (["PLAIN", "--top", "0"], "--top"),
    (["SAVED"], "a saved report or comparison holds no operations to replay"),
])
def test_bad_input_is_one_error_line(tmp_path, args, words):
    path = _plain(tmp_path)
    saved = tmp_path / "saved.json"
    assert overlapprof_here("analyze", path, "--workers", 1, "--json", saved, "-q").exit_code == 0
    got = overlapprof_here("advise", *[{"PLAIN": path, "SAVED": saved}.get(a, a) for a in args])
    assert got.exit_code == 2, got.output
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and words in lines[0]


def test_verify_a_users_own_job_prints_the_change_and_the_command(tmp_path):
    path = _plain(tmp_path)
    got = overlapprof_here("advise", path, "--verify", "--workers", 1)
    assert got.exit_code == 0, got.output
    assert f"overlapprof whatif {path} --set async=all_reduce --check NEW" in got.stdout
    assert "change 1: wait for all_reduce #1" in got.stdout


def test_a_verification_gets_its_predictions_and_prints_against_them(tmp_path):
    """What --verify does after the reruns: each tried set's prediction is the replay of its
    changes together, ``within`` says whether the realized median lies in its interval, and the
    text prints predicted against realized."""
    from overlapprof.analysis.advise import predicted
    from overlapprof.renderers.advice_text import render
    from overlapprof.report.advice import TriedSet, Verification

    path = _plain(tmp_path)
    v = Verification(sets=[TriedSet(changes=["async=all_reduce"], realized_step_us=720.0, realized_low_us=690.0,
                                    realized_high_us=750.0, speedup=1000 / 720, speedup_low=1.3, speedup_high=1.45),
                           TriedSet(changes=["bandwidth=x2", "async=all_reduce"], realized_step_us=700.0),
                           TriedSet(changes=[], realized_step_us=1010.0, predicted_step_us=1000.0)])
    predicted([path], v, workers=1)
    one, both, unchanged = v.sets
    assert unchanged.predicted_step_us == 1000.0 and unchanged.within is None  # a rerun of the traced run: left as given
    assert (one.predicted_step_us, one.within) == (pytest.approx(700), False)
    assert both.predicted_step_us == pytest.approx(whatif([path], ["bandwidth=x2,async=all_reduce"],
                                                          workers=1).predictions[0].step_us)
    a = advise([path], workers=1)
    a.verification = v
    assert Advice.from_json(a.to_json()) == a
    text = render(a)
    assert ("async=all_reduce: predicted 0.700 ms [0.700-0.700], realized 0.720 ms [0.690-0.750], speedup 1.39x "
            "[1.30-1.45]; realized OUTSIDE the prediction") in text
    assert "  unchanged (the traced configuration, rerun): predicted 1.000 ms" in text


@pytest.fixture(scope="module")
def one_bucket_run(tmp_path_factory):
    """A real 2-rank DDP run whose bucket (100 MiB) holds all 8 MiB of gradients."""
    root = tmp_path_factory.mktemp("advise_ddp")
    proc = _overlapprof("run", REPO / "workloads/ddp.py", "--nproc", 2, "--variant", "async", "--opt",
                        "bucket_cap_mb=100", "--run-id", "big", "--out", root, "--no-analyze", *SHORT_SCHEDULE,
                        timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "big-async"


def test_a_real_ddp_run_with_one_bucket_gets_smaller_buckets(one_bucket_run):
    """One 100 MiB bucket holds the 8 MiB of gradients: the trace's AccumulateGrad ops say when
    each gradient was made, smaller buckets are replayed (not a hint) and start during backward (they open
    windows: the one bucket's no_window goes); listed, left out or a hint (the saving on this loaded machine varies, and
    on a host with fewer cores than ranks and backend threads the new overlap is not costed), the
    bucket sizes are in the output with the workload's option."""
    from overlapprof.analysis.advise.replayer import Replayer

    out = one_bucket_run.parent / "advice.json"
    got = overlapprof_here("advise", one_bucket_run, "--workers", 1, "--json", out)
    assert got.exit_code == 0, got.output
    a = Advice.load(out)
    assert a.workload == "ddp" and a.traced_step_us and a.replayed_step_us == pytest.approx(a.traced_step_us, rel=0.05)
    assert not any(h.rule == "bucket_cap_mb" and "names no autograd function" in h.why for h in a.hints)
    rp = Replayer([str(one_bucket_run)], workers=1)
    assert "where its last gradient was accumulated" in rp.one_bucket_placed()
    assert rp.one_bucket() is None  # no split into halves: the gradients place the buckets
    smaller = rp.predict("bucket_cap_mb=2").prediction
    assert "8 buckets in all" in smaller.notes[0]  # 4 of 2 MiB a step (of 8.02 MiB), 2 profiled steps
    # one bucket after backward has no window (no_window); smaller ones, issued during backward, open
    # one: no_window goes. How much stays exposed in their windows (window_short) is the run's timing:
    # under the one bucket's no_window in three runs (2.1, 1.8, 2.6 against 5.4, 10.2, 4.9 ms), over
    # it in one of a fresh clone's suite (15.3 against 14.0 ms, 2026-12-07)
    base = rp.base.prediction.exposure
    assert base.no_window_us > 0 and smaller.exposure.no_window_us < 0.5 * base.no_window_us
    item = next((i for i in a.items if i.rule == "bucket_cap_mb"), None)
    if item is not None:  # sizes whose new overlap the trace cannot cost (a crowded host: assumed.py) are not tried
        assert item.action == f"rerun with --opt {item.change} (was 100)" and item.change in item.tried
        assert item.step_us == rp.predict(item.joint_change).prediction.step_us
        assert f"--opt {item.change}" in got.stdout
    else:
        assert any(r.rule == "bucket_cap_mb" for r in [*a.rejected, *a.hints]) and "bucket_cap_mb=" in got.stdout


def test_the_analyze_text_and_the_html_report_lead_with_the_advice(tmp_path):
    """A run directory the replay reads: `analyze` starts with what to change first and what it
    buys; the saved report holds it and loads back; a report saved without it still loads."""
    from overlapprof.report import Report

    run = _plain(tmp_path, "run", run={"options": {}})
    got = overlapprof_here("analyze", run, "--workers", 1, "--json", tmp_path / "r.json")
    assert got.exit_code == 0, got.output
    first = got.stdout.splitlines()[0]
    assert first.startswith("advice: first, wait for all_reduce #1") and "0.300 ms a step less" in first
    report = Report.load(tmp_path / "r.json")
    assert report.advice is not None and report.advice.items[0].step_us == pytest.approx(700)
    old = json.loads((tmp_path / "r.json").read_text())
    del old["advice"]
    assert Report.from_json(json.dumps(old)).advice is None
    traces = _plain(tmp_path, "traces")  # not a run directory: no advice, the table first
    assert not overlapprof_here("analyze", traces, "--workers", 1).stdout.startswith("advice")
    page = overlapprof_here("report", run, "-o", tmp_path / "r.html", "-q")
    assert page.exit_code == 0, page.output
    html = (tmp_path / "r.html").read_text()
    assert '<section id="advice"><h2>What to change first</h2>' in html and "0.300 ms a step less" in html


def test_the_words_of_a_run_of_overlapprof_run_name_its_options():
    """For a run of `overlapprof run` the actions are its workload's options (prefetch from the
    sync variant needs the async one; a slow rank and a host sync planted by options are named)."""
    from overlapprof.analysis.advise import terms
    from overlapprof.analysis.advise.facts import Facts

    def facts(variant, **options):
        return Facts(pairs=2, step_us=1000.0, exposed_us=100.0, cause_us={}, kind_cause_us={}, late_us={},
                     late_activity={"other": 0.75, "compute": 0.25}, workload="w", variant=variant,
                     options={"slow_rank": -1, "slow_ms": 0.0, **options})

    assert terms.prefetch(facts("sync", prefetch=1), "prefetch=2") == (
        "rerun with --variant async --opt prefetch=2 (was 0: 2 more units ahead)")
    assert terms.prefetch(facts("async", prefetch=1), "prefetch=1") == "rerun with --opt prefetch=2 (was 1: 1 more unit ahead)"
    late = terms.straggler(facts("async", slow_rank=1, slow_ms=20.0), 1, 20000.0)
    assert late == ("rank 1 is late by 20.000 ms a step, 15.000 ms of it outside compute and communication: look at "
                    "its data loading and host code (this run: --opt slow_ms=20 on rank 1: drop it)")
    assert terms.host_sync(facts("async", host_sync=True)).endswith("(this run: --opt host_sync=true: drop it)")
    assert terms.bucket(facts("async", bucket_cap_mb=2.0), "bucket_cap_mb=1") == "rerun with --opt bucket_cap_mb=1 (was 2)"
    sync = facts("sync", bucket_cap_mb=2.0)
    sync.said["async_variant"] = "yes"  # DDP's sync variant: no_sync, one all_reduce after backward
    assert terms.bucket(sync, "bucket_cap_mb=1") == (
        "rerun with --variant async --opt bucket_cap_mb=1 (the sync variant has no buckets)")
    own = facts("async")
    own.workload = None
    assert terms.bucket(own, "bucket_cap_mb=5") == "DistributedDataParallel(model, bucket_cap_mb=5)"


def test_one_bucket_with_backward_in_the_trace_is_split_and_searched(tmp_path):
    """The same single 1 MiB bucket (600 µs, issued at 800 when backward ends, waited after 100
    µs more compute: 1401 µs a step), now with backward's autograd functions named from 0: the
    gradients are spread over [0, 800), so 0.25 MiB buckets go at 200, 400, 600 and 800 (150 µs
    each, one at a time): the last ends at 950, and the step is 950 µs. A size holding the whole
    1 MiB is the traced bucket again: not tried (its halves merged back moved at the least hindered
    pace, a saving of nothing changed)."""
    from overlapprof.analysis.advise.replayer import Replayer

    events = [S.step(1, 0, 1401), S.step(2, 1401, 1401)]
    for base in (0, 1401):
        events += [S.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", base, 400),
                   S.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", base + 400, 400),
                   *_async(base + 800, 600, MIB // 4), *_compute("optimizer", base + 801, 100)]
    path = _write(tmp_path / "one", {0: events, 1: events})
    a = advise([path], workers=1)
    assert not any(h.rule == "bucket_cap_mb" for h in a.hints)
    item = a.items[0]
    assert item.rule == "bucket_cap_mb" and item.change == "bucket_cap_mb=0.25"
    assert item.step_us == pytest.approx(950, abs=2) and a.replayed_step_us == pytest.approx(1401)
    assert item.tried["bucket_cap_mb=0.5"] == pytest.approx(1100, abs=2)
    assert set(item.tried) == {"bucket_cap_mb=0.25", "bucket_cap_mb=0.5"}  # 1 MiB: the traced bucket again
    assert any("one traced bucket" in c for c in item.confidence)
    assert item.step_us == Replayer([path], workers=1).predict(item.joint_change).prediction.step_us


def test_ddps_blocking_gradient_all_reduce_is_searched_as_buckets_not_made_async(tmp_path):
    """DDP's sync variant: backward (autograd functions from 0 to 800 µs), then every gradient in
    one blocking 1 MiB all_reduce (600 µs), then 300 µs of `check` reading the reduced gradients.
    Made async with its wait at the step's end, the replay would hide the check beside it (300 µs
    of 1700, 18%), a program no rerun makes: the async variant DDP has buckets the gradients over
    backward. So the all_reduce is searched as DDP's buckets (spread over backward), and no async
    candidate is made; without DDP's option the same trace is a plain blocking all_reduce, made
    async."""
    events = [S.step(1, 0, 1700), S.step(2, 1700, 1700)]
    for base in (0, 1700):
        events += [S.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", base, 400),
                   S.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", base + 400, 400),
                   *_blocking(base + 800, 600, MIB // 4), *_compute("check", base + 1400, 300)]
    run = {"workload": {"name": "ddp", "path": str(REPO / "workloads/ddp.py")}, "variant": "sync",
           "options": {"bucket_cap_mb": 2.0, "slow_rank": -1, "slow_ms": 0.0}, **_host(8)}
    a = advise([_write(tmp_path / "ddp", {0: events, 1: events}, run)], workers=1)
    rules = {x.rule for x in [*a.items, *a.rejected, *a.hints]}
    assert "async" not in rules and "bucket_cap_mb" in rules, (a.items, a.rejected, a.hints)
    plain = advise([_write(tmp_path / "plain", {0: events, 1: events}, {**_host(8)})], workers=1)
    assert [i.change for i in plain.items] == ["async=all_reduce"]
    assert plain.items[0].saving_us == pytest.approx(300)


def test_a_straggler_late_outside_its_steps_is_a_hint_naming_it(tmp_path):
    """Rank 1 does the same work as rank 0 in its step, but starts it 300 µs later (it slept
    before its ProfilerStep): rank 0 waits 300 µs a step for it. Removing rank 1's extra work
    inside its steps removes nothing, so the straggler is a hint, named, with no number."""
    fast = [S.step(1, 0, 1300), *_compute("layer3", 0, 400), S.cpu_op("c10d::allreduce_", 400, 600),
            S.annotation("gloo:all_reduce", 400, 600), *_compute("layer4", 1000, 300)]
    late = [S.step(1, 300, 1000), *_compute("layer3", 300, 400), *_blocking(700, 300), *_compute("layer4", 1000, 300)]
    a = advise([_write(tmp_path / "outside", {0: fast, 1: late})], workers=1)
    assert not any(i.rule == "no_straggler" for i in a.items)
    hint = next(h for h in a.hints if h.rule == "no_straggler")
    assert hint.action.startswith("rank 1 is late by 0.300 ms a step") and hint.change == "no_straggler=1"
    assert "not predicted to save reliably" in hint.why


def _host(cores):
    """run.json's node: both ranks on one host with ``cores`` usable cores (loopback)."""
    return {"nodes": {"0": {"node_rank": 0, "host": "h", "cpu_cores": cores, "nproc": 2}},
            "ranks": {str(r): {"rank": r, "node_rank": 0, "traces": [f"rank{r}.1.pt.trace.json"]} for r in (0, 1)}}


def _steps(layer3, blocking=300, after=300):
    """Per step k, ``layer3[k]`` µs of compute, a blocking all_reduce, ``after`` µs of compute."""
    events, base = [], 0
    for k, before in enumerate(layer3):
        length = before + blocking + after
        events += [S.step(k + 1, base, length), *_compute("layer3", base, before),
                   *_blocking(base + before, blocking), *_compute("layer4", base + before + blocking, after)]
        base += length
    return events


def test_a_saving_under_3_percent_is_left_out_and_the_run_is_quiet(tmp_path):
    """A blocking 50 µs all_reduce followed by 20 µs of compute: 5% of the step exposed, but made
    async it hides only 20 µs (2%): under the 3% minimum, so nothing is listed, one line says so."""
    path = _write(tmp_path / "small", {r: _steps([930, 930], blocking=50, after=20) for r in (0, 1)},
                  run=_host(8))
    a = advise([path], workers=1)
    assert not a.items and a.verdict.startswith("nothing worth changing: no change is predicted to save 3% or more")
    r = next(r for r in a.rejected if r.rule == "async")
    assert r.step_us == pytest.approx(980) and "it saves 0.020 ms, under 3% of the step" in r.why


def test_a_saving_inside_the_traced_steps_spread_is_left_out(tmp_path):
    """Steps of 1000 and 2000 µs (layer3 400 or 1400 µs): their median deviation from the median
    step is 500 µs, so over 4 steps the 300 µs the async all_reduce saves is not told from the
    run's noise; over 32 steps, whose median is known that much better, it is."""
    path = _write(tmp_path / "noisy", {r: _steps([400, 1400, 400, 1400]) for r in (0, 1)}, run=_host(8))
    a = advise([path], workers=1)
    assert not a.items and a.verdict.startswith("nothing worth changing")
    why = next(r.why for r in a.rejected if r.rule == "async")
    # two medians of 4 such steps differ by sqrt(2) x 1.858 x 500 / sqrt(4) = 0.657 ms as noise
    assert "it saves 0.300 ms, under the standard error of a saving from the median step it starts from" in why
    assert "(0.657 ms, its steps' spread 0.500 ms)" in why
    steady = advise([_write(tmp_path / "steady", {r: _steps([400, 400, 400, 400]) for r in (0, 1)},
                            run=_host(8))], workers=1)
    assert [i.change for i in steady.items] == ["async=all_reduce"]  # the same change, without the spread
    longer = advise([_write(tmp_path / "longer", {r: _steps([400, 1400] * 16) for r in (0, 1)}, run=_host(8))],
                    workers=1)
    # the same spread over 32 steps: their medians differ by 0.232 ms as noise, under the 0.300 saved
    assert [i.change for i in longer.items] == ["async=all_reduce"]
    assert longer.items[0].saving_us == pytest.approx(300)


def test_a_saving_inside_the_drift_of_the_traced_steps_is_left_out(tmp_path):
    """32 steps of 1000 µs then 2000 µs (a load arriving halfway): the same spread as 32 steps
    alternating between them (500 µs, an error of 0.232 ms taken as independent, under the 300 µs
    the async all_reduce saves), but in runs: the medians of 5 batches of consecutive steps are
    1, 1, 1, 2 and 2 ms, so a run's median moves by sqrt(2) x 0.548 / sqrt(5) = 0.346 ms as
    noise, and the saving is left out; alternating, every batch's median is near 1.5 ms and it is
    listed."""
    drifting = advise([_write(tmp_path / "drift", {r: _steps([400] * 16 + [1400] * 16) for r in (0, 1)},
                              run=_host(8))], workers=1)
    assert not drifting.items
    why = next(r.why for r in drifting.rejected if r.rule == "async")
    assert "it saves 0.300 ms, under the standard error of a saving from the median step it starts from" in why
    assert "(0.346 ms from how its steps drift" in why and "its steps' spread 0.500 ms" in why
    alternating = advise([_write(tmp_path / "alt", {r: _steps([400, 1400] * 16) for r in (0, 1)}, run=_host(8))],
                         workers=1)
    assert [i.change for i in alternating.items] == ["async=all_reduce"]


def test_a_second_item_is_weighed_against_the_noise_left_after_the_first(tmp_path):
    """Rank 1 computes 2000 or 4000 µs more by turns before a blocking all_reduce: steps of 3000
    and 5000 µs (spread 1000 µs: two medians of 4 such steps differ by 1.314 ms as noise). Without the
    straggler every step is 1000 µs: the 300 µs that making the all_reduce async then saves is
    weighed against those replayed steps' spread (none), not the traced one, and is listed."""
    def step(base, extra, wait):
        return [*_compute("layer3", base, 400 + extra), *_blocking(base + 400 + extra, 300 + wait),
                *_compute("layer4", base + 700 + extra + wait, 300)]

    extras = [2000, 4000, 2000, 4000]
    fast, slow, base = [], [], 0
    for k, extra in enumerate(extras):
        length = 1000 + extra
        fast += [S.step(k + 1, base, length), *step(base, 0, extra)]
        slow += [S.step(k + 1, base, length), *step(base, extra, 0)]
        base += length
    a = advise([_write(tmp_path / "two", {0: fast, 1: slow}, run=_host(8))], workers=1)
    assert [i.change for i in a.items] == ["no_straggler=1", "async=all_reduce"], (a.items, a.rejected)
    assert a.items[1].saving_us == pytest.approx(300)


def test_overlap_on_a_host_with_fewer_cores_than_threads_is_a_hint(tmp_path):
    """The blocking all_reduce of test_a_blocking_operation..., traced where no compute ran beside
    communication: on 2 ranks sharing 2 cores (4 threads with gloo's) over loopback, the transfer
    is the cores' work for a share of its time no link measures: the change is a hint with the
    uncharged replay's number, not an item; with 8 cores, an item that says the interference was
    not measured."""
    crowded = advise([_write(tmp_path / "crowded", {r: _steps([400, 400]) for r in (0, 1)}, run=_host(2))],
                     workers=1)
    assert not crowded.items
    hint = next(h for h in crowded.hints if h.rule == "async")
    assert hint.action.startswith("wait for all_reduce #1") and "2 ranks and their backend threads (4) share 2 " \
        "cores over loopback" in hint.why and "taking the new overlap as free, gives 0.300 ms a step less" in hint.why \
        and "--verify" in hint.why
    roomy = advise([_write(tmp_path / "roomy", {r: _steps([400, 400]) for r in (0, 1)}, run=_host(8))], workers=1)
    item = roomy.items[0]
    assert item.change == "async=all_reduce" and item.saving_us == pytest.approx(300)
    assert any("interference not measured" in c and "8 cores for 2 ranks" in c for c in item.confidence)


def _loopback_steps(blocking):
    """4 steps of 400 µs compute, a blocking ``blocking`` µs all_reduce of 64 KiB, 300 µs compute."""
    events, base = [], 0
    for k in range(4):
        length = 700 + blocking
        events += [S.step(k + 1, base, length), *_compute("layer3", base, 400),
                   *_blocking(base + 400, blocking, 16384), *_compute("layer4", base + 400 + blocking, 300)]
        base += length
    return events


def test_overlap_over_loopback_on_a_crowded_host_is_charged_the_copying(tmp_path):
    """2 ranks on 2 cores over loopback, no compute beside communication. A 2-rank all_reduce is
    2 hops of 60 µs latency; of a 150 µs one the other 30 µs are its bytes' copying (20%): the
    300 µs of layer4 made to run beside it by async are charged those 30 µs, so async is listed,
    saving 120 of the 850 µs, and whatif predicts the same 730 µs. Of a 300 µs one, 180 µs (60%)
    are copying: more than half, a hint with the charged replay's saving (1000 -> 880 µs)."""
    path = _write(tmp_path / "short", {r: _loopback_steps(150) for r in (0, 1)}, run=_host(2))
    a = advise([path], workers=1)
    item = a.items[0]
    assert item.change == "async=all_reduce" and item.saving_us == pytest.approx(120, abs=1)
    assert any("over loopback; 20% of its transfers' time is the cores' work (copying their bytes" in c
               and "charged that share" in c for c in item.confidence)
    result = whatif([path], ["async=all_reduce"], workers=1)
    got = result.predictions[0]
    assert got.step_us == pytest.approx(730, abs=1)
    assert any("charged the copying it is moved beside: +0.030 ms a step" in n for n in got.notes)
    assert result.transfer[0].latency_us == pytest.approx(120)  # 2 hops: what each added operation pays
    assert any("all_reduce on 2 ranks over loopback: latency 120 us" in n for n in result.notes)
    long = advise([_write(tmp_path / "long", {r: _loopback_steps(300) for r in (0, 1)}, run=_host(2))], workers=1)
    assert not long.items
    hint = next(h for h in long.hints if h.rule == "async")
    assert "60% of its transfers' time is the cores' work" in hint.why and "0.120 ms a step less" in hint.why


def test_over_loopback_a_fitted_transfer_model_gives_the_copying(tmp_path):
    """Two sizes, so the transfer model fits: 64 KiB all_reduces of 150 µs and 128 KiB ones of
    200 µs are 100 µs latency + 50 µs per 64 KiB. The copying is the fit's bytes part, 50 and 100
    µs: 150 of the 350 µs (43%); async charges the 300 µs of layer4 beside each the copying under
    it, 0.075 ms a step on average."""
    events, base = [], 0
    for k in range(4):
        blocking, numel = (150, 16384) if k % 2 == 0 else (200, 32768)
        events += [S.step(k + 1, base, 700 + blocking), *_compute("layer3", base, 400),
                   *_blocking(base + 400, blocking, numel), *_compute("layer4", base + 400 + blocking, 300)]
        base += 700 + blocking
    result = whatif([_write(tmp_path / "two", {r: events for r in (0, 1)}, run=_host(2))], ["async=all_reduce"],
                    workers=1)
    fit = result.transfer[0]
    assert fit.source == "fit" and fit.latency_us == pytest.approx(100)
    notes = result.predictions[0].notes
    assert any("over loopback; 43% of its transfers' time is the cores' work" in n
               and "charged the copying it is moved beside: +0.075 ms a step" in n for n in notes)


def _linked(cores, pacing_us, burst=0):
    """run.json of 2 ranks on ``cores`` cores over a shared --link-rate link on which the 1 MiB
    all_reduce of :func:`_linked_steps` (each rank's 1 MiB of bus bytes: 2 MiB on the link) takes
    ``pacing_us`` beyond the token bucket's ``burst`` bytes."""
    return {**_host(cores), "link": {"shared": True, "bits_per_s": 2 * MIB * 8 / (pacing_us * 1e-6),
                                     "burst_bytes": burst}}


def _linked_steps():
    """_steps' blocking 300 µs all_reduce, with its size: 1 MiB of floats."""
    events, base = [], 0
    for k in range(4):
        events += [S.step(k + 1, base, 1000), *_compute("layer3", base, 400), *_blocking(base + 400, 300, MIB // 4),
                   *_compute("layer4", base + 700, 300)]
        base += 1000
    return events


def test_overlap_over_a_paced_link_on_a_crowded_host_is_charged_the_cores_share(tmp_path):
    """The same crowded host (2 ranks, 2 cores, no compute beside communication), but over a link
    that takes 270 of the all_reduce's 300 µs to pace its bytes: 10% of the transfer is the cores'
    work, so the 300 µs of layer4 made to run beside it are charged 30 µs: listed, saving 270 µs,
    and whatif predicts the same. Paced for only 100 µs (67% the cores'), or not at all (the token
    bucket's burst holds the 2 MiB, refilled between steps), it stays a hint."""
    path = _write(tmp_path / "paced", {r: _linked_steps() for r in (0, 1)}, run=_linked(2, 270))
    a = advise([path], workers=1)
    item = a.items[0]
    assert item.change == "async=all_reduce" and item.saving_us == pytest.approx(270, abs=1)
    assert any("10% of its transfers' time is the cores' work" in c and "charged that share" in c
               for c in item.confidence)
    got = whatif([path], ["async=all_reduce"], workers=1).predictions[0]
    assert got.step_us == pytest.approx(730, abs=1) and any("charged that share: +0.030 ms a step" in n for n in got.notes)
    copying = advise([_write(tmp_path / "copying", {r: _linked_steps() for r in (0, 1)}, run=_linked(2, 100))],
                     workers=1)
    assert not copying.items
    hint = next(h for h in copying.hints if h.rule == "async")
    assert "67% of its transfers' time is the cores' work" in hint.why and "0.100 ms a step less" in hint.why
    burst = advise([_write(tmp_path / "burst", {r: _linked_steps() for r in (0, 1)}, run=_linked(2, 270, 2 * MIB))],
                   workers=1)
    # unpaced: the cores' share is its copying, the trace's 300 µs less 2 hops' latency (87%, not 100%)
    assert not burst.items and "87% of its transfers' time is the cores' work" in next(
        h.why for h in burst.hints if h.rule == "async")
    roomy = advise([_write(tmp_path / "roomy", {r: _linked_steps() for r in (0, 1)}, run=_linked(8, 100))],
                   workers=1)
    assert roomy.items[0].saving_us == pytest.approx(300)  # cores enough: nothing charged (demoted, and 30% passes)


def test_unmeasured_interference_needs_twice_the_minimum(tmp_path):
    """Traces without run.json (the host's cores unknown) and no compute beside communication: a
    change adding overlap must save 6%, not 3%: 50 µs of a 1000 µs step (5%) is left out, saying why."""
    a = advise([_write(tmp_path / "unknown", {r: _steps([650, 650], blocking=50, after=300) for r in (0, 1)})],
               workers=1)
    assert not a.items
    r = next(r for r in a.rejected if r.rule == "async")
    assert "under 6% of the step: its new overlap's slowdown is not measured" in r.why


def test_load_reports_gives_each_run_its_advice_from_the_analysis_just_done(tmp_path):
    """What `overlapprof report` calls: a run directory's report comes with its advice (made from
    the analysis load_reports just did); a saved report without advice gets it from its run; a
    trace folder that is not a run directory gets none."""
    from overlapprof.analysis.options import AnalyzeOptions
    from overlapprof.compare.inputs import load_reports
    from overlapprof.report import Report

    run = _plain(tmp_path, "run", run={"options": {}})
    (fresh,), _ = load_reports([run], AnalyzeOptions(workers=1), advice=True)
    assert [i.change for i in fresh.advice.items] == ["async=all_reduce"]
    fresh.advice = None
    fresh.save(tmp_path / "saved.json")
    (saved,), _ = load_reports([tmp_path / "saved.json"], AnalyzeOptions(workers=1), advice=True)
    assert saved.advice is not None and saved.advice.items[0].step_us == pytest.approx(700)
    assert Report.load(tmp_path / "saved.json").advice is None  # the saved file is not rewritten
    (plain,), _ = load_reports([_plain(tmp_path, "traces")], AnalyzeOptions(workers=1), advice=True)
    assert plain.advice is None
    (without,), _ = load_reports([run], AnalyzeOptions(workers=1))
    assert without.advice is None


def test_a_saved_advice_that_is_not_one_is_one_error_line(tmp_path):
    """Advice reads JSON with the one decoder of the saved documents (report/codec.py)."""
    from overlapprof.errors import ReportError

    with pytest.raises(ReportError, match=r"^x: not an overlapprof advice \(schema 'overlapprof.report/1'"):
        Advice.from_json(b'{"schema": "overlapprof.report/1"}', source="x")
    with pytest.raises(ReportError, match=r"^x: damaged overlapprof advice"):
        Advice.from_json(b'{"schema": "overlapprof.advice/1", "items": 3}', source="x")
    (tmp_path / "a.json").write_text("{")
    with pytest.raises(ReportError, match="a.json: not an overlapprof advice"):
        Advice.load(tmp_path / "a.json")


def _late_rank(extra):
    """Two ranks, a step each per entry of ``extra``: 400 µs of compute (rank 1: 400 + extra[k]), a
    blocking all_reduce that ends 300 µs after the later rank's issue (rank 0 waits in it for rank 1),
    then 300 µs of compute."""
    ranks, base = {0: [], 1: []}, 0
    for k, more in enumerate(extra):
        end = base + 400 + more + 300
        for rank, before in ((0, 400), (1, 400 + more)):
            ranks[rank] += [S.step(k + 1, base, end + 300 - base), *_compute("layer3", base, before),
                            *_blocking(base + before, end - base - before), *_compute("layer4", end, 300)]
        base = end + 300
    return ranks


def test_a_rank_late_in_one_step_of_four_is_not_a_straggler(tmp_path):
    """Rank 1 computes 1200 µs more in the first of four steps only (a spike, as a loaded host
    makes): the others wait 300 µs a step for it on average, but in the median step not at all, so
    no_straggler is left out, said why; the same 1200 µs in every step is a straggler, listed."""
    a = advise([_write(tmp_path / "spike", _late_rank([1200, 0, 0, 0]), run=_host(8))], workers=1)
    assert not any(i.rule == "no_straggler" for i in [*a.items, *a.hints])
    why = next(r.why for r in a.rejected if r.rule == "no_straggler")
    assert why.startswith("the others wait 0.300 ms a step for rank 1 on average, but not step after step") and (
        "in the median step 0.000 ms more" in why)
    steady = advise([_write(tmp_path / "steady", _late_rank([1200] * 4), run=_host(8))], workers=1)
    assert [i.change for i in steady.items][:1] == ["no_straggler=1"]


def test_whatif_says_when_the_rank_removed_is_late_by_turns(tmp_path):
    """The same measure of lateness in whatif: no_straggler=1 on the one-step spike still gets its
    prediction, with a note that rank 1 is not late step after step; on the steady straggler, none."""
    def notes(folder, extra):
        path = _write(tmp_path / folder, _late_rank(extra), run=_host(8))
        return whatif([path], ["no_straggler=1"], workers=1).predictions[0].notes

    spike = [n for n in notes("spike", [1200, 0, 0, 0]) if "late step after step" in n]
    assert spike == ["no_straggler=1: rank 1 is not late step after step (the others wait 0.300 ms a step for it on "
                     "average, in the median step 0.000 ms more than for any other rank): ranks late by turns, as a "
                     "loaded host makes them; this predicts the run without that noise, not without a straggler"]
    assert not any("late step after step" in n for n in notes("steady", [1200] * 4))
