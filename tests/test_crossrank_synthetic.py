"""Cross-rank analysis (issue 5) on synthetic traces whose waits, transfers and matches are known
by construction: ops on some ranks only, sequence numbers, send/recv peers, clock offsets,
warm-up, stragglers, traces without shapes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import overlapprof
from overlapprof.report import Report

import synthetic as S

WORKER = 200  # gloo's worker thread
SHAPES = {"Input Dims": [[1000]], "Input type": ["float"]}


def collective(ts, dur, name="gloo:all_reduce", *, shapes=True, params=None):
    """A gloo collective span on the worker thread, inside a record_param_comms op when ``params``."""
    events = [S.annotation(name, ts, dur, tid=WORKER, args=dict(SHAPES) if shapes else {})]
    if params is not None:
        events.append(S.cpu_op("record_param_comms", ts - 1, dur + 2, tid=WORKER, args=params))
    return events


def write_ranks(tmp_path, per_rank, *, hosts=None, base_ns=None, world=None):
    """One trace file per rank; returns the paths."""
    paths = []
    for rank, events in enumerate(per_rank):
        obj = S.trace(events, rank=rank, world_size=world or len(per_rank), backend="gloo", base_ns=base_ns)
        if hosts:
            obj["host_name"] = hosts[rank]
        paths.append(S.write(tmp_path / f"rank{rank}.json", obj))
    return paths


def instances_of(arrivals, transfer, period=10_000):
    """Per rank, collective spans for instances k whose ranks arrive at k*period + arrivals[k][r]
    (None: the rank has no such op) and all end at the latest arrival + transfer."""
    ranks = len(arrivals[0])
    per_rank = [[] for _ in range(ranks)]
    for k, row in enumerate(arrivals):
        end = k * period + max(a for a in row if a is not None) + transfer
        for r, a in enumerate(row):
            if a is not None:
                per_rank[r] += collective(k * period + a, end - (k * period + a))
    return per_rank


def waits(report):
    """{(instance index, rank): wait µs} in time order of the instances."""
    out = {}
    for k, inst in enumerate(sorted(report.crossrank.instances, key=lambda i: min(i.starts_us))):
        out.update({(k, r): w for r, w in zip(inst.ranks, inst.waits_us())})
    return out


def test_ops_on_some_ranks_only_are_skipped_not_shifted(tmp_path):
    arrivals = [[0, 300, 100], [50, 0, None], [0, 0, 700], [200, 0, 0]]  # rank 2 lacks instance 1
    report = overlapprof.analyze(write_ranks(tmp_path, instances_of(arrivals, 100)), workers=1)
    c = report.crossrank
    assert [m.method for m in c.matching] == ["overlap"]
    assert [i.ranks for i in sorted(c.instances, key=lambda i: min(i.starts_us))] == [[0, 1, 2], [0, 1], [0, 1, 2], [0, 1, 2]]
    expected = {(k, r): max(a for a in row if a is not None) - a
                for k, row in enumerate(arrivals) for r, a in enumerate(row) if a is not None}
    assert waits(report) == pytest.approx(expected)
    assert all(i.transfer_us == pytest.approx(100) for i in c.instances)
    assert c.unmatched == [] and all(r.unmatched_ops == 0 for r in c.ranks)
    assert c.stragglers[0].rank == 2  # made the others wait 700 in instance 2, the most
    assert c.rank(2).caused_wait_us == pytest.approx(700 + 700)
    assert c.rank(1).caused_wait_us == pytest.approx(300 + 200)  # instance 0
    assert c.rank(0).caused_wait_us == pytest.approx(50 + 200 + 200)  # instances 1 and 3
    (group,) = c.groups
    assert (group.size, group.ranks_present, group.complete) == (3, [0, 1, 2], True)


def test_unaligned_hosts_fall_back_to_order_and_report_the_rest(tmp_path):
    arrivals = [[0, 300, 100], [50, 0, None], [0, 0, 700]]
    paths = write_ranks(tmp_path, instances_of(arrivals, 100), hosts=["a", "b", "c"])
    c = overlapprof.analyze(paths, workers=1).crossrank
    assert c.clocks == "unaligned" and [m.method for m in c.matching] == ["order"]
    assert len(c.instances) == 2 and all(i.skew_us is None for i in c.instances)
    assert sorted((u.rank, u.count) for u in c.unmatched) == [(0, 1), (1, 1)]
    assert all("counts differ" in u.reason for u in c.unmatched)


def _seq_params(seq, pg="7"):
    return {"Collective name": "allreduce", "Process Group Name": pg, "Process Group Ranks": "[0, 1]",
            "Group size": 2, "Seq": seq, "In msg nelems": 256, "dtype": "Float"}


def test_sequence_numbers_match_across_hosts_and_align_clocks(tmp_path):
    offset = 1_000_000.0  # rank 1's host clock runs this far ahead
    skews = [30, 400, 80, 250, 10]
    per_rank = [[], []]
    for k, skew in enumerate(skews):
        t, end = k * 10_000, k * 10_000 + skew + 120
        per_rank[0] += collective(t, end - t, params=_seq_params(k))
        if k != 2:  # rank 1 never recorded seq 2
            per_rank[1] += collective(t + skew + offset, end - t - skew, params=_seq_params(k))
    paths = write_ranks(tmp_path, per_rank, hosts=["a", "b"])
    c = overlapprof.analyze(paths, workers=1).crossrank
    assert c.clocks == "unaligned" and [m.method for m in c.matching] == ["seq"]
    assert sorted(i.key for i in c.instances) == [0, 1, 3, 4]
    assert [(u.rank, u.count) for u in c.unmatched] == [(0, 1)]
    assert all(i.bytes == 1024 and i.group == "7" for i in c.instances)
    assert c.rank(0).wait_us == pytest.approx(sum(s for k, s in enumerate(skews) if k != 2))
    (group,) = c.groups
    assert (group.name, group.size, group.complete, group.size_source) == ("7", 2, True, "Process Group Ranks")

    aligned = overlapprof.analyze(paths, workers=1, align_clocks=True).crossrank
    assert aligned.clocks == "aligned"
    offsets = {d.name: d.offset_us for d in aligned.domains}
    assert offsets == {"a": 0.0, "b": pytest.approx(-offset)}
    assert {d.name: d.instances for d in aligned.domains}["b"] == 4
    assert sorted(i.skew_us for i in aligned.instances) == pytest.approx(sorted(s for k, s in enumerate(skews) if k != 2))


def _p2p(kind, ts, dur, peer):
    """gloo:send/recv on the calling thread inside c10d::send/recv_ (Concrete Inputs: peer)."""
    call = "c10d::send" if kind == "send" else "c10d::recv_"
    return [S.cpu_op(call, ts - 5, 10, args={"Concrete Inputs": ["", "", str(peer), "0"]}),
            S.annotation(f"gloo:{kind}", ts, dur, args=dict(SHAPES))]


def test_send_recv_pairs_by_peer(tmp_path):
    """A pair is measured at the receiver: the transfer is its end − the later start (a send may
    end once its data is buffered, before the data arrives), a rank waits from its start to the
    later start when it ends after it, and the later start is the last rank."""
    rank0 = _p2p("send", 0, 50, 1) + _p2p("send", 1000, 40, 1) + _p2p("recv", 2000, 700, 1)
    rank1 = _p2p("recv", 10, 500, 0) + _p2p("recv", 1010, 30, 0) + _p2p("send", 2600, 60, 0)
    rank0 += _p2p("send", 3000, 50, 1)  # buffered, done before the receiver came: no wait
    rank1 += _p2p("recv", 3500, 10, 0)
    rank1 += [S.annotation("gloo:send", 5000, 20)]  # no c10d op around it: no peer
    c = overlapprof.analyze(write_ranks(tmp_path, [rank0, rank1]), workers=1).crossrank
    assert [(m.kind, m.method, m.instances) for m in c.matching] == [("send_recv", "pair-order", 4)]
    got = sorted((i.ranks, i.durations_us, i.transfer_us, i.last_rank) for i in c.instances)
    assert got == [([0, 1], [40.0, 30.0], 30.0, 1), ([0, 1], [50.0, 10.0], 10.0, 1),
                   ([0, 1], [50.0, 500.0], 500.0, 1), ([1, 0], [60.0, 700.0], 100.0, 1)]
    # Rank 1's first transfer (500 µs) is 20x its median: warm-up, left out of the sums below.
    assert [(w.rank, w.transfer_us) for w in c.warmups] == [(1, 500.0)]
    assert c.rank(1).wait_us == 0 and c.rank(0).wait_us == 10 + 600 + 0
    # A rank's own transfer is the rest of its operation, at most the pair's.
    assert c.rank(0).transfer_us == 30 + 100 + 10 and c.rank(1).transfer_us == 30 + 60 + 10
    assert c.stragglers[0].rank == 1 and c.stragglers[0].caused_wait_us == 610
    assert [(u.rank, u.count) for u in c.unmatched] == [(1, 1)] and "peer" in c.unmatched[0].reason
    assert all(b.bus_factor == 1.0 and b.bytes == 4000 for b in c.bandwidth if b.transfer == "matched")


def test_gpu_kernels_take_the_collective_of_their_annotation(tmp_path):
    """NCCL runs all_reduce as generic SendRecv kernels in some versions: the annotation around the
    launch names the collective, and its recorded shape gives the bytes."""
    per_rank = []
    for rank, (start, dur) in enumerate([(100, 900), (700, 300)]):
        events = []
        for k in range(2):
            launch = k * 10_000 + start - 50
            events.append(S.annotation("nccl:all_reduce", launch - 10, 30, args={"Input Dims": [[2048]], "Input type": ["c10::BFloat16"]}))
            events += S.launched("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", launch, k * 10_000 + start, dur)
            events += S.launched("ampere_sgemm_128x64_nn", launch + 5, k * 10_000 + 5000, 100)
        per_rank.append(events)
    report = overlapprof.analyze(write_ranks(tmp_path, per_rank), workers=1)
    assert [k.kind for k in report.ranks[0].kinds] == ["send_recv"]  # OVERLAP.md's per-kind metrics: by name
    c = report.crossrank
    assert [(m.kind, m.method, m.instances) for m in c.matching] == [("all_reduce", "order", 2)]
    assert all(i.bytes == 4096 and i.transfer_us == 300 and i.last_rank == 1 for i in c.instances)
    assert c.rank(0).wait_us == 2 * 600
    row = next(b for b in c.bandwidth if b.transfer == "matched")
    assert (row.bus_factor, row.algbw_gbps) == (1.0, pytest.approx(4096 / 300 / 1e3))


def test_without_shapes_bandwidth_is_unknown(tmp_path):
    per_rank = [[], []]
    for k in range(3):
        per_rank[0] += collective(k * 1000, 200, shapes=False)
        per_rank[1] += collective(k * 1000 + 50, 150, shapes=False)
    report = overlapprof.analyze(write_ranks(tmp_path, per_rank), workers=1)
    (row,) = report.crossrank.bandwidth
    assert (row.bytes, row.algbw_gbps, row.busbw_gbps, row.count) == (None, None, None, 3)
    assert row.median_transfer_us == 150 and row.median_wait_us == 25
    from overlapprof.renderers import collectives_table, csv

    assert "unknown" in collectives_table.render(report)
    head, *lines = csv.render(report, by="collective").splitlines()
    assert lines[0].split(",")[head.split(",").index("bytes")] == ""


def test_first_op_slow_on_every_rank_is_warmup_not_wait(tmp_path):
    arrivals = [[0, 100]] + [[0, 20 * k] for k in range(1, 6)]
    per_rank = instances_of(arrivals, 100)
    # Instance 0 transfers for 50 ms on both ranks: communicator set-up.
    per_rank = [[dict(e, dur=e["dur"] + 50_000) if e["ts"] < 1000 else e for e in events] for events in per_rank]
    c = overlapprof.analyze(write_ranks(tmp_path, per_rank), workers=1).crossrank
    assert sorted((w.rank, w.kind) for w in c.warmups) == [(0, "all_reduce"), (1, "all_reduce")]
    assert all(w.factor >= 10 for w in c.warmups)
    assert [i.warmup for i in sorted(c.instances, key=lambda i: min(i.starts_us))] == [True] + [False] * 5
    assert c.rank(0).wait_us == pytest.approx(sum(20 * k for k in range(1, 6)))  # instance 0's 100 left out
    assert c.rank(0).warmup_ops == 1 and c.rank(1).caused_wait_us == pytest.approx(300)
    assert all(b.count == 5 for b in c.bandwidth)


def test_first_op_long_on_one_rank_only_is_a_wait(tmp_path):
    arrivals = [[0, 30_000]] + [[0, 20 * k] for k in range(1, 6)]  # rank 1 arrives 30 ms late once
    c = overlapprof.analyze(write_ranks(tmp_path, instances_of(arrivals, 100, period=100_000)), workers=1).crossrank
    assert c.warmups == []
    assert c.rank(0).wait_us == pytest.approx(30_000 + sum(20 * k for k in range(1, 6)))


def test_stragglers_and_the_exposed_share_of_waiting(tmp_path):
    arrivals = [[0, 0, 1000, 0]] * 3  # rank 2 arrives 1000 µs late every time; transfer 200 µs
    per_rank = instances_of(arrivals, 200)
    for k in range(3):  # rank 0 computes through the first 400 µs of each wait
        per_rank[0].append(S.cpu_op("aten::mm", k * 10_000, 400))
    c = overlapprof.analyze(write_ranks(tmp_path, per_rank), workers=1).crossrank
    assert [(s.rank, s.caused_wait_us, s.share, s.last_arrivals) for s in c.stragglers] == [(2, 9000.0, 1.0, 3)]
    r0 = c.rank(0)
    assert (r0.wait_us, r0.transfer_us, r0.exposed_wait_us, r0.exposed_comm_us, r0.comm_us) == (3000, 600, 1800, 2400, 3600)
    assert r0.wait_share == pytest.approx(3000 / 3600) and r0.exposed_wait_share == pytest.approx(0.75)
    assert c.rank(1).wait_share == pytest.approx(3000 / 3600) == c.rank(1).exposed_wait_share
    assert c.straggler == 2 and c.straggler_evidence == (
        "caused 100% of the waiting, most of it in 1 of the 1 steps with waiting (last in 3 instances)")
    assert c.rank(2).wait_us == 0 and c.rank(2).last_arrivals == 3


def test_report_round_trip_and_cli(tmp_path):
    arrivals = [[0, 0, 1000]] * 2
    paths = write_ranks(tmp_path, instances_of(arrivals, 200))
    report = overlapprof.analyze(paths, workers=1)
    assert Report.from_json(report.to_json()) == report
    cli = [sys.executable, "-m", "overlapprof", "analyze", *map(str, paths)]
    out = subprocess.run([*cli, "--by", "collective"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "waited for: rank 2 caused 4.000 ms" in out.stdout and "65.54 kB" not in out.stdout
    assert "straggler: rank 2 (the others waited 4.000 ms for it; it caused 100% of the waiting" in out.stdout
    assert "4.00 kB" in out.stdout and "all_reduce" in out.stdout
    out = subprocess.run([*cli, "--json", "-", "--align-clocks"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["options"]["align_clocks"] is True and data["comms"]["stragglers"][0]["rank"] == 2
    saved = tmp_path / "report.json"
    saved.write_text(out.stdout)
    again = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(saved), "--by", "collective"],
                           capture_output=True, text=True)
    assert again.returncode == 0 and "straggler: rank 2" in again.stdout


def test_html_report_has_the_straggler_chart(tmp_path):
    from overlapprof.compare import compare
    from overlapprof.renderers import html

    arrivals = [[0, 0, 1000, 0]] * 3
    report = overlapprof.analyze(write_ranks(tmp_path, instances_of(arrivals, 200)), workers=1)
    page = html.render(compare([report]))
    section = page[page.index("Stragglers: waiting vs transferring"):]
    section = section[: section.index("</section>")]
    assert 'src="data:image/svg+xml;base64,' in section
    assert "<td>2</td><td>9.000</td><td>100.00%</td><td>3</td>" in section.replace("\n", "")
    assert "group default: 4 of 4 ranks have traces (complete" in section
    # One rank: nothing matched, no chart.
    (tmp_path / "one").mkdir()
    single = overlapprof.analyze(write_ranks(tmp_path / "one", instances_of(arrivals, 200)[:1]), workers=1)
    assert single.crossrank is not None and "Stragglers: waiting vs transferring" not in html.render(compare([single]))


def test_odd_values_in_the_trace_are_ignored_not_fatal(tmp_path):
    params = {"Collective name": 7, "Process Group Name": ["x"], "Process Group Ranks": "not ranks",
              "Group size": "two", "Seq": "3", "In msg nelems": -5, "dtype": "NoSuchType", "Src Rank": "peer"}
    per_rank = [collective(0, 100, params=params) + _p2p("send", 500, 10, "x") for _ in range(2)]
    paths = write_ranks(tmp_path, per_rank)
    for p, odd in zip(paths, ({"pg_config": "nope"}, {"pg_config": [{"pg_name": 0, "ranks": "x"}]})):
        obj = json.loads(p.read_text())
        obj["distributedInfo"].update(odd)
        obj["host_name"] = 12
        p.write_text(json.dumps(obj))
    c = overlapprof.analyze(paths, workers=1).crossrank
    assert [(m.kind, m.instances) for m in c.matching] == [("all_reduce", 1), ("send_recv", 0)]
    assert c.instances[0].bytes == 4000  # from the annotation's shape; the bad counts are ignored
    assert c.clocks == "shared" and all(r.host is None for r in c.ranks)


def test_no_straggler_is_named_when_the_waiting_is_shared(tmp_path):
    """Each of 3 ranks arrives last in turn, 500 µs late: the waiting is spread evenly, so no rank
    is named (before: the first of the list, with a third of the waiting); the numbers are said."""
    arrivals = [[500, 0, 0], [0, 500, 0], [0, 0, 500]] * 2
    report = overlapprof.analyze(write_ranks(tmp_path, instances_of(arrivals, 200)), workers=1)
    c = report.crossrank
    assert c.straggler is None and len(c.stragglers) == 3
    assert c.straggler_evidence.startswith("the most waited-for, rank 0, caused 33% of the waiting, 1.0x rank 1's")
    from overlapprof.renderers import table

    assert "straggler: no clear straggler (the most waited-for, rank 0, caused 33%" in table.render(report)
