"""OVERLAP.md version 3's end of an async send (overlapprof/analysis/crossrank/transfer_ends.py),
on a real 2-rank gloo run of issue 39's probe (tests/workloads/p2p_probe.py): rank 0 isend, then
``compute_ms`` of matmuls, then wait(); rank 1 a blocking recv (variant ``recv``) or an irecv
waited after the same matmuls (variant ``irecv``). What the analyzer reports is checked against
the raw trace events, read here with json alone. Then the rule's cases on hand-made traces:
clocks apart, clocks not aligned, --no-comms, a wait() for another operation."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

import overlapprof
from overlapprof.renderers.table import p2p_lines
from overlapprof.report.metrics import by_rank

from conftest import REPO, SHORT_SCHEDULE, _overlapprof, overlapprof_here

COMPUTE_MS = 100.0  # long beside a 1 MiB transfer over loopback, even on a loaded machine


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("probe")
    proc = _overlapprof("run", REPO / "tests/workloads/p2p_probe.py", "--nproc", 2, "--run-id", "probe", "--out", root,
                        "--no-analyze", "-q", *SHORT_SCHEDULE, "--opt", f"compute_ms={COMPUTE_MS}",
                        "--variant", "recv", "--variant", "irecv", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {v: root / f"probe-{v}" for v in ("recv", "irecv")}


def _spans(run: Path, rank: int, name: str) -> list[tuple[float, float]]:
    """(start, end) of every complete event ``name`` of the rank's trace, on the shared clock (µs), in time order."""
    (path,) = run.glob(f"rank{rank}.*.json")
    trace = json.loads(path.read_text())
    base = trace.get("baseTimeNanoseconds", 0) / 1e3
    return sorted((e["ts"] + base, e["ts"] + base + e["dur"]) for e in trace["traceEvents"]
                  if e.get("ph") == "X" and e.get("name") == name)


def _union_length(spans) -> float:
    total, reach = 0.0, -float("inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _send_comm(report) -> float:
    (kind,) = [k for k in by_rank(report.ranks, 0).kinds if k.kind == "send_recv"]
    return kind.comm_us


def test_send_ends_at_the_blocking_receive(probe):
    """The bug was real (each gloo:send span lasts the matmuls), and rank 0's send communication
    is its c10d::send call and its span up to the end of the matched blocking receive."""
    run = probe["recv"]
    calls, sends, recvs = _spans(run, 0, "c10d::send"), _spans(run, 0, "gloo:send"), _spans(run, 1, "gloo:recv")
    assert len(calls) == len(sends) == len(recvs) == 2
    assert all(end - start >= 0.9 * COMPUTE_MS * 1e3 for start, end in sends)  # issue to wait()
    report = overlapprof.analyze(run, workers=1)
    expected = sum(_union_length([call, (gs, min(max(re, gs), ge))])
                   for call, (gs, ge), (_, re) in zip(calls, sends, recvs))
    assert _send_comm(report) == pytest.approx(expected, abs=1.0)
    cut = sum(re < ge for (_, ge), (_, re) in zip(sends, recvs))
    assert cut >= 1  # the probe's point: the data was there long before the wait
    rank0, rank1 = (by_rank(report.ranks, r) for r in (0, 1))
    assert (rank0.p2p.async_ops, rank0.p2p.ends_from_peer, rank0.p2p.upper_bound) == (2, cut, 0)
    assert rank1.p2p.async_ops == 0  # a blocking recv: its end is when the data arrived
    assert _send_comm(report) < sum(ge - gs for gs, ge in sends)
    assert p2p_lines(report) == ["async sends whose communication ends at the end of the receive matched to them "
                                 f"(one its thread waited for): rank 0 {cut}"]


def test_async_receive_leaves_an_upper_bound(probe):
    """Rank 1's irecv ends at its wait(): nothing shows when the data arrived, so neither its span
    nor rank 0's send is cut, and both are said to be upper bounds."""
    run = probe["irecv"]
    calls, sends = _spans(run, 0, "c10d::send"), _spans(run, 0, "gloo:send")
    report = overlapprof.analyze(run, workers=1)
    assert _send_comm(report) == pytest.approx(sum(_union_length([c, s]) for c, s in zip(calls, sends)), abs=1.0)
    for rank in report.ranks:
        p = rank.p2p
        assert (p.async_ops, p.ends_from_peer, p.upper_bound) == (2, 0, 2), rank.rank
        spans = _spans(run, rank.rank, "gloo:send" if rank.rank == 0 else "gloo:recv")
        assert p.upper_bound_us == pytest.approx(_union_length(spans), abs=1.0)
    (line,) = p2p_lines(report)
    assert line.startswith("upper bound: async send/recv spans that end at their wait()") and "rank 1 2 (" in line


@pytest.mark.parametrize("variant", ["recv", "irecv"])
def test_on_disk_is_the_same(probe, variant):
    """The ranks measured again with the receive's ends give the same report on disk as in memory."""
    memory = msgspec.to_builtins(overlapprof.analyze(probe[variant], workers=1, memory_budget="1TB", comm_ops=True))
    on_disk = msgspec.to_builtins(overlapprof.analyze(probe[variant], workers=1, memory_budget=0, comm_ops=True))
    for d in (memory, on_disk):
        d.pop("options")
    assert memory == on_disk


def test_the_table_says_it(probe):
    got = overlapprof_here("analyze", probe["irecv"])
    assert got.exit_code == 0, got.output
    assert "upper bound: async send/recv spans that end at their wait()" in got.stdout


# -- the rule on hand-made traces: known clocks, known ends

import synthetic as S  # noqa: E402

SHAPES = {"Input Dims": [[1000]], "Input type": ["float"]}


def _p2p(kind, ts, dur, peer):
    """gloo:send/recv on the calling thread, opened inside its c10d call (Concrete Inputs: the peer)."""
    call = "c10d::send" if kind == "send" else "c10d::recv_"
    return [S.cpu_op(call, ts - 5, 10, args={"Concrete Inputs": ["", "", str(peer), "0"]}),
            S.annotation(f"gloo:{kind}", ts, dur, args=dict(SHAPES))]


def _ranks(tmp_path, shift_us=0.0, hosts=None):
    """Rank 0: two async sends (matmuls inside, wait() at the span's end); rank 1: two blocking
    receives, the first ending at 3000 µs (long before its send's 41000), the second at 62000
    (after its send's 61000). Rank 1's clock runs ``shift_us`` behind (its baseTimeNanoseconds
    later by as much): the same instants."""
    rank0 = _p2p("send", 1000, 40_000, 1) + [S.cpu_op("aten::mm", 1100 + 1000 * k, 900) for k in range(39)]
    rank0 += _p2p("send", 50_000, 11_000, 1) + [S.cpu_op("aten::mm", 50_100 + 1000 * k, 900) for k in range(10)]
    rank1 = _p2p("recv", 1000 - shift_us, 2000, 0) + _p2p("recv", 50_000 - shift_us, 12_000, 0)
    paths = []
    for rank, (events, base) in enumerate(((rank0, 0), (rank1, int(shift_us * 1000)))):
        obj = S.trace(events, rank=rank, world_size=2, backend="gloo", base_ns=10**18 + base)
        if hosts:
            obj["host_name"] = hosts[rank]
        paths.append(S.write(tmp_path / f"rank{rank}.json", obj))
    return paths


@pytest.mark.parametrize("shift_us", [0.0, 500.0])
def test_cut_at_the_receive_on_the_common_clock(tmp_path, shift_us):
    report = overlapprof.analyze(_ranks(tmp_path, shift_us), workers=1, comm_ops=True)
    rank0, rank1 = (by_rank(report.ranks, r) for r in (0, 1))
    assert (rank0.p2p.async_ops, rank0.p2p.ends_from_peer, rank0.p2p.upper_bound) == (2, 1, 0)
    assert rank1.p2p.async_ops == 0
    # [995, 1005) ∪ [1000, 3000), then [49995, 50005) ∪ [50000, 61000) as recorded
    assert rank0.metrics.comm_us == 2005 + 11_005
    assert [r.dur for r in rank0.comm_records if r.name == "gloo:send"] == [2000, 11_000]
    on_disk = overlapprof.analyze(_ranks(tmp_path, shift_us), workers=1, comm_ops=True, memory_budget=0)
    a, b = (msgspec.to_builtins(r) for r in (report, on_disk))
    a.pop("options"), b.pop("options")
    assert a == b


def test_clocks_not_aligned_show_nothing(tmp_path):
    """Two hosts whose clocks are not aligned: the receive's end cannot be put on the send's clock."""
    report = overlapprof.analyze(_ranks(tmp_path, hosts=["a", "b"]), workers=1)
    assert report.crossrank.clocks == "unaligned"
    rank0 = by_rank(report.ranks, 0)
    assert (rank0.p2p.ends_from_peer, rank0.p2p.upper_bound) == (0, 2)
    assert rank0.metrics.comm_us == 40_005 + 11_005 and rank0.p2p.upper_bound_us == 51_000


def test_no_comms_leaves_the_spans(tmp_path):
    report = overlapprof.analyze(_ranks(tmp_path), workers=1, comms=False)
    assert by_rank(report.ranks, 0).metrics.comm_us == 40_005 + 11_005
    assert all(r.p2p is None for r in report.ranks)


def test_a_wait_for_another_operation_shows_nothing(tmp_path):
    """Rank 1 posts a send and a receive, computes, waits for its send (blocked until 30000 µs),
    then for its receive, which ends 100 µs later: its thread was blocked, but on the send; when
    the receive's data arrived is not shown, so rank 0's send to it is not cut."""
    mm = [S.cpu_op("aten::mm", 1100 + 1000 * k, 900) for k in range(9)]
    rank0 = _p2p("send", 1000, 40_000, 1) + [S.cpu_op("aten::mm", 1100 + 1000 * k, 900) for k in range(39)]
    rank0 += _p2p("recv", 42_000, 100, 1)
    rank1 = _p2p("send", 900, 29_100, 0) + _p2p("recv", 1000, 29_100, 0) + mm
    paths = [S.write(tmp_path / f"rank{r}.json", S.trace(ev, rank=r, world_size=2, backend="gloo"))
             for r, ev in enumerate((rank0, rank1))]
    report = overlapprof.analyze(paths, workers=1)
    rank0, rank1 = (by_rank(report.ranks, r) for r in (0, 1))
    assert (rank0.p2p.async_ops, rank0.p2p.ends_from_peer, rank0.p2p.upper_bound) == (1, 0, 1)
    assert (rank1.p2p.async_ops, rank1.p2p.ends_from_peer, rank1.p2p.upper_bound) == (1, 0, 1)
    assert rank0.metrics.comm_us == 40_005 + 100 + 5  # [995, 41000) and [41995, 42100)


def test_a_blocking_send_whose_call_takes_most_of_its_span_is_waited_for(tmp_path):
    """A blocking send of a small message: its c10d call returns 40 µs into its 60 µs span and the
    thread waits for the rest, with no compute anywhere in it. The issuing call is not other work,
    so the send is waited for (before: 20 of 60 µs blocked, judged async and cut at the receive's
    end, 28 µs off a real sync ring's communication)."""
    args = {"Concrete Inputs": ["", "", "1", "0"]}
    rank0 = [S.cpu_op("c10d::send", 995, 45, args=args), S.annotation("gloo:send", 1000, 60, args=dict(SHAPES)),
             S.cpu_op("aten::mm", 2000, 900)]
    rank1 = _p2p("recv", 1000, 50, 0) + [S.cpu_op("aten::mm", 2000, 900)]
    paths = [S.write(tmp_path / f"rank{r}.json", S.trace(ev, rank=r, world_size=2, backend="gloo"))
             for r, ev in enumerate((rank0, rank1))]
    report = overlapprof.analyze(paths, workers=1)
    rank0 = by_rank(report.ranks, 0)
    assert (rank0.p2p.async_ops, rank0.p2p.ends_from_peer, rank0.p2p.upper_bound) == (0, 0, 0)
    assert rank0.metrics.comm_us == 65  # [995, 1060) as recorded
