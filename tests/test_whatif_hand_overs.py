"""``async=send_recv`` over loopback on a crowded host whose trace has no compute beside
communication: the hand-overs' time beside compute is not measured, so no number (issue 35)."""

from __future__ import annotations

import json

import pytest

from overlapprof.analysis.replay.predict import whatif

import synthetic as S

SHAPES = {"Input Dims": [[1000]], "Input type": ["float"]}


def _p2p(kind, at, dur, peer):
    """A blocking gloo send or receive of 4000 bytes to or from ``peer``: its c10d call and span."""
    call = "c10d::send" if kind == "send" else "c10d::recv_"
    return [S.cpu_op(call, at, dur, args={"Concrete Inputs": ["", "", str(peer), "0"]}),
            S.annotation(f"gloo:{kind}", at, dur, args=dict(SHAPES))]


def _stages():
    """test_analysis_replay's GPipe step: 2 micro-batches on 2 stages, hand-overs of 100 µs (the
    first receive 300, stage 0's first gradient 500: waiting for the peer), every forward and
    backward 200 µs; 1600 µs on stage 0, 1400 on stage 1."""
    mm = lambda at: S.cpu_op("aten::mm", at, 200)  # noqa: E731
    stage0 = [S.step(1, 0, 1600), mm(0), *_p2p("send", 200, 100, 1), mm(300), *_p2p("send", 500, 100, 1),
              *_p2p("recv", 600, 500, 1), mm(1100), *_p2p("recv", 1300, 100, 1), mm(1400)]
    stage1 = [S.step(1, 0, 1400), *_p2p("recv", 0, 300, 0), mm(300), *_p2p("recv", 500, 100, 0), mm(600), mm(800),
              *_p2p("send", 1000, 100, 0), mm(1100), *_p2p("send", 1300, 100, 0)]
    return {0: stage0, 1: stage1}


def _write(folder, ranks, cores=None, link=None):
    """The traces, and where ``cores`` is given a run.json with both ranks on one host of that
    many cores (with ``link``: a --link-rate link of that many bytes a µs)."""
    folder.mkdir()
    for rank, events in ranks.items():
        S.write(folder / f"rank{rank}.1.pt.trace.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    if cores is not None:
        record = {"schema_version": 1, "world_size": 2, "device": "cpu",
                  "nodes": {"0": {"node_rank": 0, "host": "h", "cpu_cores": cores, "nproc": 2}},
                  "ranks": {str(r): {"rank": r, "node_rank": 0, "traces": [f"rank{r}.1.pt.trace.json"]} for r in (0, 1)}}
        if link:
            record["link"] = {"kind": "tbf", "rate": f"{link * 8}mbit", "bits_per_s": link * 8e6, "burst_bytes": 131072,
                              "shared": True}
        (folder / "run.json").write_text(json.dumps(record))
    return str(folder)


def _predict(path, change="async=send_recv"):
    return whatif([path], [change], workers=1).predictions[0]


def test_a_pipeline_made_async_keeps_each_receive_before_the_compute_that_uses_it(tmp_path):
    """On a host with cores to spare (8 for 2 ranks). The sends' waits move, and each stage posts
    its receives where its first one was (irecv), still waiting for each before the compute that
    uses it. Stage 0 forwards micro-batch 1 at [200, 400) while its first send goes and sends it
    at 400; stage 1 posted that receive at 0, so it moves [400, 500) while stage 1 forwards
    micro-batch 0 ([300, 500)): stage 1 forwards 1 at [500, 700), backwards [700, 900) and
    [900, 1100), sending each gradient as it is done ([900, 1000), [1100, 1200): 1200 µs);
    stage 0 posted both gradients' receives at 400 and backwards at [1000, 1200) and [1200,
    1400): 1400 µs, median 1300. Without the early receives, stage 1's second one is posted only
    at 500, after its forward, and every later step waits 100 µs more: 1600 and 1400 (before
    issue 37). With the receives made async too (before issue 35), stage 1 computed its forwards
    before their inputs came: 900 and 900, a step no pipeline can take."""
    p = _predict(_write(tmp_path / "roomy", _stages(), cores=8))
    assert p.modelled and p.notes[0] == "async=send_recv: 4 blocking send_recv operations made asynchronous"
    assert p.ranks == {0: pytest.approx(1400), 1: pytest.approx(1200)} and p.step_us == pytest.approx(1300)


def test_async_hand_overs_on_crowded_cores_over_loopback_have_no_number(tmp_path):
    """2 ranks on 2 cores over loopback: 4 threads with gloo's. The trace has no compute beside
    communication, so how long a hand-over takes once compute holds its backend thread's core is
    not measured: not modelled, and said. Over a --link-rate link (the link paces the transfer),
    or on 8 cores, it is predicted; other changes of the same trace are too. Over the link each
    send's 4000 bytes pass within the link's burst, unpaced, and of a hand-over's 100 µs (its
    least hindered transfer) only what is beyond one hop's latency (copying.HOP_US, 60 µs) is the
    cores' work, copying its bytes (cores.py): a share of 0.4. Each stage now computes 200 µs
    beside a hand-over (stage 0 beside its first send and its last gradient's receive, stage 1
    beside its second receive and its first gradient's send, the receives posted early): 80 µs
    charged on each, 1480 and 1280 µs (1400 and 1200 uncharged)."""
    crowded = _write(tmp_path / "crowded", _stages(), cores=2)
    p = _predict(crowded)
    assert not p.modelled and p.step_us is None
    assert p.reason == ("async=send_recv: over loopback 2 ranks and their backend threads (4) share 2 cores and the "
                        "trace has no compute beside communication: how long a hand-over takes once compute holds "
                        "the core its backend thread needs is not measured")
    assert _predict(crowded, "compute=x0.5").modelled
    link = _predict(_write(tmp_path / "link", _stages(), cores=2, link=125))
    assert link.modelled and link.ranks == {0: pytest.approx(1480), 1: pytest.approx(1280)}
    assert _predict(_write(tmp_path / "roomy", _stages(), cores=8)).step_us == pytest.approx(1300)
