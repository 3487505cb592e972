"""One trace file decoded by several processes gives the report one process gives (issue 12)."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import overlapprof
from overlapprof.analysis import engine as E
from overlapprof.analysis.engine import parallel as P
from overlapprof.analysis.rank import parts as PR
from overlapprof.analysis.columns import Index
from overlapprof.analysis.engine.claims import Claims
from overlapprof.errors import TraceError
from overlapprof.renderers import json as json_renderer
from overlapprof.trace import decode as D
from overlapprof.trace import kineto
from overlapprof.trace import ranges as TR
from overlapprof.trace import reader as R

import synthetic as S

DATA = Path(__file__).parent / "data"
REAL = sorted(DATA.glob("*/*.json.gz"))
# Strings that look like JSON structure: braces, brackets, quotes, escaped quotes and backslashes,
# an escaped newline followed by the event-start indentation, commas.
TRICKY = ['a{"b": [1, {"c"}]}', 'say \\"hi\\" {', '}\n  {"ph":"X"}', "back\\\\slash\\\\", '", {', "\u00e9{\u4e2d}"]


@pytest.fixture
def small(monkeypatch):
    """Every file is read in parallel, in many small ranges and pieces (workers inherit this: fork)."""
    monkeypatch.setattr(E, "PARALLEL_MIN_TEXT", 0)
    monkeypatch.setattr(P, "RANGE_MIN", 1)
    monkeypatch.setattr(TR, "PIECE_BYTES", 3000)
    monkeypatch.setattr(R, "READ_BYTES", 997)
    monkeypatch.setattr(PR, "SUBPART_BYTES", 7000)  # a pool process sends its range back in several parts


def _json(paths, workers, **kw) -> str:
    return json_renderer.render(overlapprof.analyze(paths, workers=workers, **kw))


def _tricky_events(blocks: int) -> list[dict]:
    """GPU events with an analytic overlap (comm [t+10, t+60), compute [t+40, t+100) per block),
    the comm launches inside record_param_comms calls, and names and args full of TRICKY strings."""
    events = [S.step(0, 0, blocks * 100)]
    for b in range(blocks):
        t = b * 100
        odd = TRICKY[b % len(TRICKY)]
        events.append(S.cpu_op("record_param_comms", t, 8, args={
            "Collective name": "allreduce", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
            "Group size": 2, "Seq": b, "In msg nelems": 64, "Out msg nelems": 64, "dtype": "Float", "note": odd}))
        comm = S.launched(f"ncclDevKernel_AllReduce {odd}", t + 1, t + 10, 50, stream=20)
        compute = S.launched(f"gemm<{odd}>", t + 9, t + 40, 60)  # launched after the call: compute
        comm[1]["args"]["label"] = odd
        compute[0]["args"]["Input Dims"] = [[b, 2], [odd]]
        events += comm + compute
        events.append(S.cpu_op(f"aten::{odd}", t + 20, 3, args={"Concrete Inputs": [odd, "", "1"]}))
        events.append({"ph": "i", "cat": "instant", "name": odd, "pid": 1, "tid": 100, "ts": t + 5, "s": "t"})
    return events


_kineto_text = S.kineto_text


@pytest.mark.parametrize("path", REAL, ids=[p.parent.name for p in REAL])
def test_real_traces_same_report(path, small):
    single = _json([path], 1)
    assert _json([path], 2) == single
    try:
        TR.probe(path)
    except R.LayoutError:
        assert path.parent.name == "trace_filter"  # one line per file: read in one process
        return
    assert P.read(path, Index(), None, 2) is not None  # really read in parallel, not fallen back


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_a_byte_order_mark_is_read_past_by_every_reader(tmp_path, small, gz):
    """A UTF-8 byte-order mark before a real trace (Windows tools write one): read in one
    process, whole or streamed, and in parallel, the report is the trace's own (before: "invalid
    character (byte 0)")."""
    path = DATA / "negative_queue_length" / "rank0.json.gz"
    text = gzip.decompress(path.read_bytes())
    marked = tmp_path / ("bom.json.gz" if gz else "bom.json")
    marked.write_bytes(gzip.compress(kineto.BOM + text, 1) if gz else kineto.BOM + text)
    want = overlapprof.analyze([path], workers=1).ranks[0]
    for workers in (1, 2):
        got = overlapprof.analyze([marked], workers=workers).ranks[0]
        assert (got.metrics, got.steps, got.kinds) == (want.metrics, want.steps, want.kinds), workers
    assert P.read(marked, Index(), None, 2) is not None  # really read in parallel


def test_finding_the_first_event_searches_each_byte_once():
    """Text that never names "traceEvents" (another JSON, or the JSON Array Format), fed 64 KiB
    at a time as the parallel probe reads it: every byte is searched once, not the whole buffer
    again at each piece (before: 3-9 s to refuse a large file)."""
    class Counted(bytearray):
        searched = 0

        def find(self, sub, start=0, *args):
            Counted.searched += len(self) - start
            return super().find(sub, start, *args)

    finder, buf, piece = R.FirstEvent(), Counted(), b'{"a": "' + b"x" * 65_000 + b'"},\n'
    for _ in range(200):  # 13 MB
        buf += piece
        assert finder.find(buf) is None
    assert Counted.searched < len(buf) + 200 * len(b'"traceEvents"')
    with pytest.raises(R.LayoutError):  # the array layout is known at once
        R.FirstEvent().find(bytearray(kineto.BOM + b' [{"ph": "X"}'))


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_tricky_strings_same_report(tmp_path, small, gz):
    events = _tricky_events(120)
    text = _kineto_text(events)
    path = S.write(tmp_path / ("t.json.gz" if gz else "t.json"), gzip.compress(text) if gz else text, gz=False)
    single = _json([path], 1, comm_ops=True)
    assert _json([path], 3, comm_ops=True) == single
    assert P.read(path, Index(), None, 3) is not None  # really read in parallel
    m = json.loads(single)["ranks"][0]["metrics"]
    assert (m["comm_us"], m["compute_us"], m["overlapped_us"]) == (50 * 120, 60 * 120, 20 * 120)
    assert len(json.loads(single)["ranks"][0]["comm_ops"]) == 120


def test_after_a_parallel_read_a_second_thread_classifies_and_reports(tmp_path, small, monkeypatch):
    """A rank read by several processes is classified a time bucket ahead, and its steps' metrics
    made beside its kinds', in a second thread (engine/ahead.py): the report as one process's,
    past the budget (many time buckets) and within it."""
    from overlapprof.analysis.rank import bounded, metrics

    threads = {"extract": set(), "step_metrics": set()}

    def spied(module, name):
        real = getattr(module, name)

        def spy(*a, **k):
            threads[name].add(threading.current_thread().name)
            return real(*a, **k)
        monkeypatch.setattr(module, name, spy)

    spied(bounded, "extract")
    spied(metrics, "step_metrics")
    path = S.write(tmp_path / "t.json", _kineto_text(_tricky_events(400)), gz=False)
    single = _json([path], 1, comm_ops=True, memory_budget=0)
    assert threads == {"extract": {"MainThread"}, "step_metrics": {"MainThread"}}  # one worker: one thread
    for budget in (0, None):
        threads = {"extract": set(), "step_metrics": set()}
        assert _json([path], 2, comm_ops=True, memory_budget=budget) == single
        assert any(t.startswith("overlapprof-ahead") for t in threads["extract"]), threads
        assert threads["step_metrics"] == {"overlapprof-both_0"}, threads


def _inside_strings(text: bytes) -> list[bool]:
    """Whether each byte of a JSON text is inside a string (after its opening quote)."""
    out, in_string, escaped = [], False, False
    for c in text:
        out.append(in_string)
        if escaped:
            escaped = False
        elif in_string and c == 0x5C:
            escaped = True
        elif c == 0x22:
            in_string = not in_string
    return out


def _decoded(texts) -> list:
    return [e for t in texts for e in D.THREAD_ROW_DECODER.decode(t)]


def _key(e):
    return (e.ph, e.cat, e.name, e.ts, e.dur, bytes(e.args), e.pid, e.tid)


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_ranges_tile_the_events_at_any_offset(tmp_path, monkeypatch, gz):
    """Cut at every offset (gzip: every 7th), inside strings too: the two ranges hold each event
    exactly once, in order, and the range with the last event start holds the tail."""
    monkeypatch.setattr(R, "READ_BYTES", 61)
    events = _tricky_events(6)
    text = _kineto_text(events)
    path = S.write(tmp_path / "t.json", gzip.compress(text) if gz else text, gz=False)
    probe = TR.probe(path)
    assert probe.header == text[: probe.first] and text[probe.first : probe.first + 4] == b"\n  {"
    top = D.DECODER.decode(text)
    want = [_key(e) for e in D.THREAD_ROW_DECODER.decode(b"[" + b",".join(top.traceEvents) + b"]")]
    inside = _inside_strings(text)
    inside_string = 0
    for cut in range(probe.first, len(text) + 1, 7 if gz else 1):
        inside_string += cut < len(text) and inside[cut]
        first, second = TR.RangeText(path, probe.first, cut, piece_bytes=200), TR.RangeText(path, cut, piece_bytes=200)
        got = _decoded(first.pieces()) + _decoded(second.pieces())
        tails = [r.tail for r in (first, second) if r.tail is not None]
        assert len(tails) == 1
        last = D.DECODER.decode(probe.header + tails[0])
        got += D.THREAD_ROW_DECODER.decode(b"[" + b",".join(last.traceEvents) + b"]")
        assert [_key(e) for e in got] == want, cut
        assert last.distributedInfo.rank == 0 and last.baseTimeNanoseconds == 5
    assert inside_string > 100  # many cuts fell inside strings


def _error(path, workers) -> str:
    with pytest.raises(TraceError) as info:
        overlapprof.analyze(path, workers=workers)
    return str(info.value)


def test_bad_files_same_error(tmp_path, small):
    text = _kineto_text(_tricky_events(60))
    cut = S.write(tmp_path / "cut.json", text[: len(text) * 2 // 3], gz=False)
    assert "not valid JSON" in _error(cut, 1) and _error(cut, 2) == _error(cut, 1)
    gz = S.write(tmp_path / "cut.json.gz", gzip.compress(text)[:-40], gz=False)
    assert "truncated gzip" in _error(gz, 1) and _error(gz, 2) == _error(gz, 1)
    events = _tricky_events(60)
    events[333]["ts"] = "soon"
    bad = S.write(tmp_path / "bad.json", _kineto_text(events), gz=False)
    assert "event 333: 'ts' is not a number" in _error(bad, 1) and _error(bad, 2) == _error(bad, 1)
    events = _tricky_events(60)
    events[200]["args"] = [1, 2]  # a kernel's args not an object: found by a worker, worded by this process
    odd = S.write(tmp_path / "odd.json", _kineto_text(events), gz=False)
    assert _error(odd, 2) == _error(odd, 1)


def test_cli_workers_one_line_error(tmp_path):
    """The CLI with --workers 2 on a truncated gzip that is large enough to be read in parallel."""
    text = _kineto_text(_tricky_events(40_000))
    assert len(text) > 1 << 20
    path = S.write(tmp_path / "big.json.gz", gzip.compress(text, compresslevel=1)[:-1000], gz=False)
    proc = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", "--workers", "2", str(path)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OVERLAPPROF_PARALLEL_MIN_MB": "1"})  # read it in parallel
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"Error: {path}: truncated gzip (the file ends before the compressed stream)"]


def test_a_worker_killed_mid_read_leaves_one_process_to_read(tmp_path, monkeypatch):
    """A pool process killed while it reads its range: the parallel read gives up (None), so the
    file is read in this process; no folder is left behind."""
    monkeypatch.setattr(E, "PARALLEL_MIN_TEXT", 0)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    path = S.write(tmp_path / "t.json", _kineto_text(_tricky_events(3000)), gz=False)
    parent = os.getpid()
    real = PR.read_part

    def killed(job, between=None, flush=None, claim=None):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(job, between, flush, claim)

    monkeypatch.setattr(PR, "read_part", killed)
    assert P.read(path, Index(), None, 2) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    monkeypatch.setattr(PR, "read_part", real)
    assert P.read(path, Index(), None, 2) is not None


def test_parts_through_files_are_cleaned_up(tmp_path, small, monkeypatch):
    """The pool's parts come back through files of a temporary folder, removed afterwards."""
    spool = tmp_path / "tmp"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))
    text = _kineto_text(_tricky_events(40))
    path = S.write(tmp_path / "t.json", text, gz=False)
    assert P.read(path, Index(), None, 3) is not None
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_a_thief_takes_the_end_of_a_range(tmp_path, monkeypatch, gz):
    """A range whose second half is stolen after any number of pieces (the cut at any byte,
    inside strings too): its reader stops at the cut, and it and the thief's range hold each
    event exactly once, in order."""
    monkeypatch.setattr(R, "READ_BYTES", 61)
    monkeypatch.setattr(D, "_INFLATE_MAX", 61)
    text = _kineto_text(_tricky_events(6))
    path = S.write(tmp_path / "t.json", gzip.compress(text) if gz else text, gz=False)
    probe = TR.probe(path)
    top = D.DECODER.decode(text)
    want = [_key(e) for e in D.THREAD_ROW_DECODER.decode(b"[" + b",".join(top.traceEvents) + b"]")][:-1]
    inside = _inside_strings(text)
    b = len(text) - 300  # the last range, [b, end), holds the tail: not stealable
    steals, in_strings = 0, 0
    for after in range(len(text) // 200 + 2):
        (tmp_path / str(after)).mkdir()
        claims = Claims(str(tmp_path / str(after)), 1)
        claims.open(0, probe.first, b)
        owner = TR.RangeText(path, probe.first, b, piece_bytes=200, claim=lambda hi: claims.claim(0, hi))
        got, thief = [], None
        for k, piece in enumerate(owner.pieces()):
            got += _decoded([piece])
            if k + 1 == after:
                taken = claims.steal(0, 1, P.SKIP_COST if gz else 0.0)
                if taken is not None:
                    thief = TR.RangeText(path, *taken, piece_bytes=200)
                    in_strings += inside[taken[0]]
        if thief is not None:
            got += _decoded(thief.pieces())
            steals += 1
        rest = TR.RangeText(path, b, piece_bytes=200)
        got += _decoded(rest.pieces())
        assert owner.tail is None and rest.tail is not None
        assert [_key(e) for e in got] == want, after
    assert steals > 10 and in_strings > 2


def test_schedule_steals_from_the_pool(tmp_path, small):
    """This process's own range is a few events: it then takes the unread ends of the pool's
    range, and the columns are those one process reads."""
    text = _kineto_text(_tricky_events(3000))
    path = S.write(tmp_path / "t.json", text, gz=False)
    probe = TR.probe(path)
    back = len(text) - 2000
    base = PR.Job(str(path), False, bytes=len(text))
    jobs = [PR.Job(**{**base.__dict__, "a": probe.first, "b": back, "number": 0}),
            PR.Job(**{**base.__dict__, "a": back, "number": 1})]
    claims = Claims(str(tmp_path), len(jobs))
    names, alone = Index(), PR.Merge(Index(), None, 1 << 16)
    for a, b in ((probe.first, back), (back, None)):  # the same last range: the same tail, left out of both
        alone.add(PR.read_part(PR.Job(**{**base.__dict__, "a": a, "b": b})))
    merged = PR.Merge(names, None, 1 << 16)
    spool = tmp_path / "spool"
    spool.mkdir()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        for job in jobs:
            job.spool, job.claims = str(spool), claims.path
        schedule = P._Schedule(jobs, pool, 1, claims)
        for part in schedule.parts():
            assert not part.failed
            merged.add(part)
    assert schedule.stolen >= 1 and len(schedule.jobs) == 2 + schedule.stolen
    got, want = merged.result()[0], alone.result()[0]
    assert got.keys() == want.keys() and [k for k in want if not np.array_equal(got[k], want[k])] == []
    assert merged.events == alone.events > 20_000


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_gzip_ranges_take_equal_time(count):
    """With a cost of reaching a range's start (gzip), range k is as much shorter as its reader
    pays to reach it: start * cost + length is the same for all; without, equal lengths."""
    probe = TR.Probe(True, b"", 100, 100 + 10_000_000)
    for cost in (0.0, P.SKIP_COST):
        ranges = TR.split(probe, count, cost)
        starts = [a for a, _ in ranges]
        ends = [b for _, b in ranges[:-1]] + [probe.size]
        assert starts[0] == probe.first and ranges[-1][1] is None and starts[1:] == ends[:-1]
        times = [(a - probe.first) * cost + (b - a) for a, b in zip(starts, ends)]
        assert max(times) - min(times) <= count, (cost, times)
        assert cost == 0 or count == 1 or ends[0] - starts[0] > ends[-1] - starts[-1]


def test_a_gzip_thief_reads_the_kept_text(tmp_path, monkeypatch):
    """The end of a gzip range, kept as this process inflated its way past it (its own range
    after it): a thief that begins anywhere in it reads the same events from memory as from the
    file, without the file (it is gone); one that begins before it reads the file."""
    monkeypatch.setattr(R, "READ_BYTES", 61)
    monkeypatch.setattr(D, "_INFLATE_MAX", 61)
    text = _kineto_text(_tricky_events(6))
    path = S.write(tmp_path / "t.json", gzip.compress(text), gz=False)
    probe = TR.probe(path)
    b = text.rfind(R.EVENT_START, 0, len(text) - 300)  # the next range starts with an event
    lows = list(range(probe.first, b, 131))
    cuts = list(range(probe.first, b, 37))
    file_events = {cut: [_key(e) for e in _decoded(TR.RangeText(path, cut, b, piece_bytes=200).pieces())]
                   for cut in cuts}
    kept = TR.Kept([(lo, b + 50) for lo in lows])
    own = TR.RangeText(path, b, piece_bytes=200, kept=kept)
    assert _decoded(own.pieces()) and own.tail is not None
    for lo in lows:
        steps, end = kept.text_from(lo)
        assert b"".join(v for _, v in steps) == text[lo : b + 50] and end == b + 50
        assert [s for s, _ in steps] == sorted(s for s, _ in steps) and steps[0][0] == lo
    assert kept.start_of(lows[-1]) == probe.first  # the first window that holds it
    assert kept.text_from(probe.first - 1) is None and kept.start_of(b + 50) is None
    os.remove(path)
    for cut in cuts:
        got = TR.RangeText(path, cut, b, piece_bytes=200, kept=kept)
        assert [_key(e) for e in _decoded(got.pieces())] == file_events[cut], cut
    with pytest.raises(FileNotFoundError):  # a window that ends before the range does: the rest is read from the file
        list(TR.RangeText(path, b - 10, None, kept=TR.Kept([(b - 10, b)])).pieces())


def test_a_thief_that_reaches_its_range_for_free_takes_the_middle(tmp_path):
    """gzip: a thief pays for the text before its cut, unless it begins where this process kept
    the text (``free``): then the middle of what is left, or ``free`` when that is sooner done."""
    claims = Claims(str(tmp_path), 1)
    cases = {None: int(1000 / 1.9), 300: 500, 520: 520, 700: int(1000 / 1.9)}
    for free, want in cases.items():
        claims.open(0, 0, 1000)
        assert claims.steal(0, 1, 0.1, free) == (want, 1000), free
    claims.open(0, 0, 1000)
    assert claims.steal(0, 1, 0.0, 300) == (500, 1000) and claims.steal(0, 600, 0.0) is None
    claims.close()


def test_a_pool_range_comes_back_in_parts(tmp_path, small):
    """A pool process sends its range back as it reads, a part per SUBPART_BYTES of text, each
    with tables of its own: merged in order they are the range read in one part, and their files
    are gone once read."""
    text = _kineto_text(_tricky_events(3000))
    path = S.write(tmp_path / "t.json", text, gz=False)
    probe = TR.probe(path)
    spool = tmp_path / "spool"
    spool.mkdir()
    job = PR.Job(str(path), False, a=probe.first, bytes=len(text), header=probe.header)
    sent = PR.pool_read(PR.Job(**{**job.__dict__, "spool": str(spool)}))
    assert len(sent.spooled) > 10 and len(list(spool.iterdir())) == len(sent.spooled)
    parts = list(PR.unspool(sent))
    assert list(spool.iterdir()) == [] and parts[-1].top is not None and parts[0].top is None

    def merged(pieces):
        m = PR.Merge(Index(), None, 1 << 16)
        for p in pieces:
            m.add(p)
            if p.last is not None:
                m.add(p.last)
        return m

    got, want = merged(parts), merged([PR.read_part(job)])
    a, b = got.result()[0], want.result()[0]
    assert a.keys() == b.keys() and [k for k in b if not np.array_equal(a[k], b[k])] == []
    assert got.events == want.events > 20_000 and list(got.threads) == list(want.threads)


_ARMED: list[int] = []  # pids: the at-fork hook below sends them SIGTERM once


def _sigterm_after_fork():
    if _ARMED and _ARMED[0] == os.getpid():
        _ARMED.clear()
        os.kill(os.getpid(), signal.SIGTERM)


os.register_at_fork(after_in_parent=_sigterm_after_fork)


def test_a_sigterm_while_the_pool_forks_is_not_lost():
    """A SIGTERM that arrives as the pool forks its workers (here: sent by an at-fork hook, where
    the interpreter prints and drops an exception) still unwinds ``overlapprof analyze``: it
    raises from the submit, once the forks are done; the workers take SIGTERM again."""
    from overlapprof.analysis.engine.pool import forked
    from overlapprof.cli.common import Terminated, unwind_on_sigterm

    old = signal.getsignal(signal.SIGTERM)
    unwind_on_sigterm()
    try:
        with pytest.raises(Terminated):
            with forked(2) as pool:
                _ARMED.append(os.getpid())
                pool.submit(os.getpid)
                pool.submit(os.getpid)  # not reached: the first submit raised
    finally:
        _ARMED.clear()
        signal.signal(signal.SIGTERM, old)
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with forked(1) as pool:  # a worker's mask: SIGTERM taken
        assert pool.submit(_blocked).result() == []


def _blocked():
    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, set()))
