"""``analyze`` past its memory budget (``--memory-budget``, issue 12's bounded memory): the
per-event data on disk, the same report as in memory, float for float (per rank, the cross-rank section, the causes of exposure and the
overlap bound, ``--comm-ops`` records, export's lanes), on every real trace, on real CPU runs, on
random traces cut into many buckets whose unions are merged a few at a time, read by one process
or two; what it refuses; and what happens when its files find no room."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import overlapprof
from overlapprof.analysis import analyzer
from overlapprof.analysis import engine as E
from overlapprof.analysis.engine import store as ST
from overlapprof.analysis.options import AnalyzeOptions
from overlapprof.analysis.rank import spilled, unions
from overlapprof.analysis.engine import parallel as PS
from overlapprof.analysis.rank import parts
from overlapprof.analysis.spill import Sample
from overlapprof.errors import OverlapprofError
from overlapprof.trace.discover import discover

import real_data
import synthetic as S

DATA = Path(__file__).parent / "data"
ON_DISK = {"memory_budget": 0}  # every rank measured with its events on disk
IN_MEMORY = {"memory_budget": "1TB"}
REAL = real_data.jobs()
REPO = Path(__file__).resolve().parent.parent


def _per_rank(report) -> dict:
    d = msgspec.to_builtins(report)
    for key in ("options", "comms", "warnings", "filters"):
        d.pop(key, None)
    return d


def _whole(report) -> dict:
    d = msgspec.to_builtins(report)
    d.pop("options")
    return d


def _assert_same(a, b, where="report"):
    """Equal, floats to the last bit (the same unions, summed the same way), and of one type."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b and type(a) is type(b), (where, a, b)  # 0 is not 0.0 in the JSON


def _both(paths, workers=1, **kw):
    memory = overlapprof.analyze(paths, comms=False, workers=1, **kw)
    on_disk = overlapprof.analyze(paths, comms=False, workers=workers, **ON_DISK, **kw)
    return memory, on_disk


@pytest.fixture
def small_pieces(monkeypatch):
    """Buckets and windows of a few hundred rows: every trace is cut into many, and their
    unions are merged two at a time."""
    monkeypatch.setattr(spilled, "BUCKET_ROWS", 300)
    monkeypatch.setattr(unions, "_MERGE_PARTS", 2)


@pytest.mark.parametrize("folder", REAL, ids=[real_data.name(d) for d in REAL])
def test_real_traces_same_report(folder):
    """The whole report: each rank, the cross-rank section, the causes and bounds, the --comm-ops
    records and export's lanes."""
    for kw in ({}, {"comm_ops": True, "lanes": True}):
        memory = overlapprof.analyze(folder, workers=1, **IN_MEMORY, **kw)
        on_disk = overlapprof.analyze(folder, workers=1, **ON_DISK, **kw)
        _assert_same(_whole(memory), _whole(on_disk))


@pytest.mark.parametrize("folder", [d for d in REAL if d.name != "mtia"], ids=real_data.name)
def test_real_traces_in_small_pieces_and_filters(folder, small_pieces):
    for kw in ({}, {"drop_last_step": True}, {"require_launch": True}):
        memory, on_disk = _both(folder, **kw)
        _assert_same(_per_rank(memory), _per_rank(on_disk))
        assert on_disk.filters == memory.filters
    memory = overlapprof.analyze(folder, workers=1, **IN_MEMORY, drop_last_step=True)
    on_disk = overlapprof.analyze(folder, workers=1, **ON_DISK, drop_last_step=True)
    _assert_same(_whole(memory), _whole(on_disk))


def test_real_cpu_runs(runs, small_pieces):
    for run in runs.ring.values():
        memory = overlapprof.analyze(run, workers=1, **IN_MEMORY, comm_ops=True)
        on_disk = overlapprof.analyze(run, workers=1, **ON_DISK, comm_ops=True)
        _assert_same(_whole(memory), _whole(on_disk))
        assert on_disk.ranks[0].mode == "cpu" and on_disk.ranks[0].kinds and on_disk.crossrank.bandwidth
        assert on_disk.ranks[0].exposure is not None and on_disk.ranks[0].overlap_bound_us is not None


def _random_gpu_trace(rng: random.Random, steps=6) -> list[dict]:
    """Steps of kernels, memcpys and NCCL kernels launched inside and outside nested
    communication calls on two threads, some without their launch, long calls, in shuffled
    file order."""
    events, t = [], 0.0
    for n in range(steps):
        length = rng.uniform(300, 900)
        events.append(S.step(n, t, length))
        for _ in range(rng.randint(20, 60)):
            tid = rng.choice((S.MAIN_TID, S.MAIN_TID + 1))
            at = t + rng.uniform(0, length)
            if rng.random() < 0.2:  # a call, with kernels launched inside it
                events.append(S.cpu_op("c10d::allreduce_", at, rng.uniform(5, 400), tid=tid))
                events.append(S.cpu_op("record_param_comms", at + 1, rng.uniform(2, 30), tid=tid,
                                       args={"Collective name": rng.choice(("allreduce", "broadcast", "send"))}))
                for _ in range(rng.randint(0, 3)):
                    rt, k = S.launched(rng.choice(("ampere_sgemm", "Memcpy DtoD", "elementwise")), at + 2,
                                       at + rng.uniform(3, 200), rng.uniform(1, 80))
                    rt["tid"] = tid
                    if k["name"].startswith("Memcpy"):
                        k["cat"] = "gpu_memcpy"
                    events += [rt, k]
            else:
                name = rng.choice(("ampere_sgemm", "ncclDevKernel_AllGather", "fused_add", "Memcpy HtoD"))
                rt, k = S.launched(name, at, at + rng.uniform(0, 300), rng.uniform(0, 120),
                                   stream=rng.choice((7, 20)))
                rt["tid"] = tid
                if name.startswith("Memcpy"):
                    k["cat"] = "gpu_memcpy"
                events += [k] if rng.random() < 0.1 else [rt, k]  # a kernel whose launch is not recorded
        t += length + rng.uniform(0, 50)
    rng.shuffle(events)
    return events


def _random_cpu_trace(rng: random.Random, steps=6) -> list[dict]:
    """gloo-style CPU ranks: compute ops, c10d calls with backend spans on the calling thread and
    on a worker thread, ops inside the calls."""
    events, t = [], 0.0
    for n in range(steps):
        length = rng.uniform(300, 900)
        events.append(S.step(n, t, length, cat="cpu_op"))
        for _ in range(rng.randint(20, 60)):
            at = t + rng.uniform(0, length)
            if rng.random() < 0.3:
                kind = rng.choice(("allreduce", "broadcast", "recv"))
                dur = rng.uniform(5, 200)
                events.append(S.cpu_op(f"c10d::{kind}_", at, dur))
                events.append(S.annotation(f"gloo:{kind}", at + rng.uniform(0, 50), rng.uniform(1, 100),
                                           tid=rng.choice((S.MAIN_TID, S.MAIN_TID + 5))))
                events.append(S.cpu_op("aten::copy_", at + 1, 2))  # inside the call: not compute
            else:
                events.append(S.cpu_op(rng.choice(("aten::mm", "aten::add")), at, rng.uniform(0, 80),
                                       tid=rng.choice((S.MAIN_TID, S.MAIN_TID + 1))))
        t += length
    rng.shuffle(events)
    return events


@pytest.mark.parametrize("seed", range(6))
def test_random_traces_in_small_pieces(tmp_path, small_pieces, seed):
    rng = random.Random(seed)
    make = _random_gpu_trace if seed % 2 == 0 else _random_cpu_trace
    paths = [S.write(tmp_path / f"rank{r}.pt.trace.json", S.trace(make(rng), rank=r, world_size=2)) for r in range(2)]
    for kw in ({}, {"drop_last_step": True}, {"require_launch": True}):
        memory, on_disk = _both(paths, **kw)
        _assert_same(_per_rank(memory), _per_rank(on_disk))
    memory = overlapprof.analyze(paths, workers=1, **IN_MEMORY, comm_ops=True)
    on_disk = overlapprof.analyze(paths, workers=1, **ON_DISK, comm_ops=True)
    _assert_same(_whole(memory), _whole(on_disk))


def test_two_processes_read_one_file(tmp_path, monkeypatch, small_pieces):
    """A large file is read by the parallel decoder into the spilled rows (this process's own
    parts wait in files too): the same report as one process in memory."""
    monkeypatch.setattr(E, "PARALLEL_MIN_TEXT", 1 << 10)
    monkeypatch.setattr(PS, "RANGE_MIN", 1 << 12)
    monkeypatch.setattr(parts, "SUBPART_BYTES", 1 << 13)  # a range comes back in several parts
    used = []
    read = PS.read

    def spy(*a, **k):
        got = read(*a, **k)
        used.append(got is not None and k.get("sink") is not None)
        return got

    monkeypatch.setattr(PS, "read", spy)
    rng = random.Random(7)
    path = S.write(tmp_path / "rank0.pt.trace.json", S.kineto_text(_random_gpu_trace(rng, steps=20)), gz=False)
    memory, on_disk = _both([path], workers=2)
    _assert_same(_per_rank(memory), _per_rank(on_disk))
    assert used and all(used)


def test_temporary_files_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    overlapprof.analyze(DATA / "nccl_parser_config", comms=False, workers=1, **ON_DISK)
    (tmp_path / "in").mkdir()
    bad = S.write(tmp_path / "in" / "rank0.json",  # no 'dur': found once the file is read
                  b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1}]}')
    with pytest.raises(OverlapprofError) as on_disk:
        overlapprof.analyze(bad, **ON_DISK, workers=1)
    with pytest.raises(OverlapprofError) as memory:
        overlapprof.analyze(bad, workers=1)
    assert str(on_disk.value) == str(memory.value)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("overlapprof-")]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "overlapprof", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_cli_like_hta_on_disk(tmp_path):
    """--like-hta past the budget: HTA's numbers, as in memory, from rows kept on disk."""
    outs = {}
    for budget in ("0", "1TB"):
        out = tmp_path / f"{budget}.json"
        got = _cli("analyze", DATA / "trace_filter", "--memory-budget", budget, "--like-hta", "--json", out, "-q")
        assert got.returncode == 0, got.stderr
        outs[budget] = msgspec.json.decode(out.read_bytes())
    assert "bounded_memory" not in outs["0"]["options"]  # how it ran changes no number: not recorded
    assert [r["metrics"] for r in outs["0"]["ranks"]] == [r["metrics"] for r in outs["1TB"]["ranks"]]


def test_cli_tables_are_the_same():
    for by in ("rank", "collective"):
        got = _cli("analyze", DATA / "trace_filter", "--memory-budget", 0, "--workers", 1, "--by", by)
        plain = _cli("analyze", DATA / "trace_filter", "--memory-budget", "1TB", "--workers", 1, "--by", by)
        assert got.returncode == 0 and plain.returncode == 0, got.stderr + plain.stderr
        assert got.stdout == plain.stdout
        assert "why exposed" in got.stdout or by == "collective"
    off = _cli("analyze", DATA / "trace_filter", "--memory-budget", 0, "--no-comms", "--by", "collective")
    assert off.returncode == 0 and "(cross-rank analysis off: --no-comms)" in off.stdout


def test_sample_stays_small_and_even():
    sample = Sample(size=1000)
    for k in range(100):
        sample.add(np.arange(k * 10_000, (k + 1) * 10_000, dtype=np.float64))
    assert sample.values.size <= 1000
    cuts = sample.quantiles(4)
    assert np.allclose(cuts, [250_000, 500_000, 750_000], rtol=0.02)


def test_no_room_for_the_files_is_one_line(tmp_path):
    """A TMPDIR that does not exist, and one that fills up (files limited to 64 KB: EFBIG)."""
    import resource
    import signal

    env = {**os.environ, "TMPDIR": str(tmp_path / "missing")}
    got = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(DATA / "nccl_parser_config"),
                          "--memory-budget", "0", "--workers", "1"], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=120)
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stderr
    assert "cannot keep the events of" in got.stderr and "set TMPDIR" in got.stderr

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    env["TMPDIR"] = str(tmp_path)
    got = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(DATA / "nccl_parser_config"),
                          "--memory-budget", "0", "--workers", "1"], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=120, preexec_fn=small_files)
    assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stderr
    assert "cannot keep the events of" in got.stderr and "Traceback" not in got.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("overlapprof-")]  # removed all the same


def test_the_default_budget(monkeypatch):
    """With no --memory-budget a rank's rows are kept in a store of the default budget: a trace
    that fits is one bucket and writes nothing; the report is the one every budget gives; a bad
    size is one line; a report saved when the options recorded ``bounded_memory`` still loads."""
    from overlapprof.analysis.options import DEFAULT_MEMORY_BUDGET
    from overlapprof.report import Report

    assert AnalyzeOptions().budget_bytes() == DEFAULT_MEMORY_BUDGET == 1 << 30
    folder = DATA / "nccl_parser_config"
    assert spilled._buckets(next(folder.glob("*.json*")), DEFAULT_MEMORY_BUDGET) == 1
    made = []
    real = ST.make_folder
    monkeypatch.setattr(ST, "make_folder", lambda path: made.append(1) or real(path))
    got = overlapprof.analyze(folder, workers=1, comm_ops=True)
    assert not made  # nothing written
    _assert_same(_whole(got), _whole(overlapprof.analyze(folder, workers=1, **ON_DISK, comm_ops=True)))
    hta = overlapprof.analyze(folder, workers=1, like_hta=True)
    assert hta.ranks[0].metrics == overlapprof.analyze(folder, workers=1, like_hta=True, **ON_DISK).ranks[0].metrics
    for bad in ("lots", "-1GB", "4 parsecs"):
        with pytest.raises(OverlapprofError, match="--memory-budget .*: not a size"):
            overlapprof.analyze(folder, workers=1, memory_budget=bad)
    old = msgspec.json.decode(got.to_json())
    old["options"]["bounded_memory"] = True
    loaded = Report.from_json(msgspec.json.encode(old))
    assert msgspec.to_builtins(loaded) == msgspec.to_builtins(got)


def test_no_room_is_not_a_bad_trace(tmp_path):
    """--allow-partial skips bad traces, not ranks that found no room for their files."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "missing")}
    got = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(DATA / "trace_filter"),
                          "--memory-budget", "0", "--allow-partial", "--workers", "1"], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=120)
    assert got.returncode == 1 and got.stderr.startswith("Error: past the memory budget: cannot keep"), got.stderr
    assert str(tmp_path / "missing") in got.stderr


def test_sigterm_removes_the_files(tmp_path):
    """A job scheduler's SIGTERM unwinds like Ctrl-C: exit 143, 'Error: terminated', no files left."""
    import signal
    import time

    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_traces.py"), str(tmp_path / "big"), "--size", "200"],
                   check=True, capture_output=True, timeout=300)
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "overlapprof", "analyze", str(tmp_path / "big"),
                             "--memory-budget", "0", "-q", "--workers", "2"], cwd=REPO, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "tmp").iterdir()) and time.monotonic() < deadline:  # the spill has begun
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err.strip() == "Error: terminated", (proc.returncode, err)
    assert not list((tmp_path / "tmp").iterdir())


def test_compare_report_and_plot_take_the_flag(runs, tmp_path):
    """The commands that analyze runs take --memory-budget too (what the automatic
    switch's warning names); export does not (it switches by itself when the traces would not fit)."""
    pair = [runs.ring["sync"], runs.ring["async"]]
    on_disk = _cli("compare", *pair, "--memory-budget", 0, "-q")
    memory = _cli("compare", *pair, "--memory-budget", "1TB", "-q")
    assert on_disk.returncode == 0, on_disk.stderr
    assert on_disk.stdout == memory.stdout
    for cmd, out in (("report", tmp_path / "r.html"), ("plot", tmp_path / "p.png")):
        got = _cli(cmd, runs.ring["async"], "--memory-budget", 0, "-o", out, "-q")
        assert got.returncode == 0 and out.stat().st_size > 0, got.stderr
    assert "--memory-budget" not in _cli("export", "--help").stdout


def _stream_wait(ts, stream, record_corr, corr):
    """Kineto's record of cudaStreamWaitEvent under enable_cuda_sync_events (cat cuda_sync)."""
    return {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": stream, "ts": ts, "dur": 1,
            "args": {"correlation": corr, "wait_on_cuda_event_record_corr_id": record_corr, "wait_on_stream": 20,
                     "stream": stream, "cuda_sync_kind": "Stream Wait Event"}}


def _cuda_sync_trace(rng: random.Random, steps=4) -> list[dict]:
    """Steps of NCCL all-reduces on stream 20, each followed by a cudaEventRecord and, mostly, a
    wait of stream 7 on it, with matmuls on stream 7 before and after: their windows come
    from the sync events (OVERLAP.md section 1), in shuffled file order."""
    events, t, corr = [], 0.0, 10_000
    for n in range(steps):
        events.append(S.step(n, t, 2000))
        at = t + 10
        for _ in range(rng.randint(5, 15)):
            events += S.launched("ncclDevKernel_AllReduce_Sum_f32_RING_LL", at, at + rng.uniform(5, 40),
                                 rng.uniform(20, 200), stream=20)
            corr += 2
            events.append(S.runtime(at + 2, 1, corr, name="cudaEventRecord"))
            for _ in range(rng.randint(0, 2)):  # compute launched before the wait
                events += S.launched("ampere_sgemm_128x64_nn", at + 3, at + rng.uniform(5, 60), rng.uniform(5, 90),
                                     stream=7)
            if rng.random() < 0.8:
                events += [S.runtime(at + 6, 1, corr + 1, name="cudaStreamWaitEvent"),
                           _stream_wait(at + 6, 7, corr, corr + 1)]
            events += S.launched("ampere_sgemm_128x64_nn", at + 7, at + rng.uniform(8, 300), rng.uniform(5, 90),
                                 stream=7)
            at += rng.uniform(20, 120)
        t += 2000
    rng.shuffle(events)
    return events


@pytest.mark.parametrize("seed", range(3))
def test_cuda_sync_windows_on_disk(tmp_path, small_pieces, seed):
    """A GPU trace with NCCL and CUDA sync events (enable_cuda_sync_events): on disk the
    operations get the need times, windows and causes they get in memory (they were NaN when
    the records were read again without the sync rows)."""
    rng = random.Random(seed)
    paths = [S.write(tmp_path / f"rank{r}.pt.trace.json", S.trace(_cuda_sync_trace(rng), rank=r, world_size=2))
             for r in range(2)]
    memory = overlapprof.analyze(paths, workers=1, **IN_MEMORY, comm_ops=True)
    on_disk = overlapprof.analyze(paths, workers=1, **ON_DISK, comm_ops=True)
    waited = [op for r in memory.ranks for op in r.operations if op.need_us < op.end_us]
    assert len(waited) > 5  # needed before they ended: from the sync events
    _assert_same(_whole(memory), _whole(on_disk))


def _rank_reports(folder, budget, **kw) -> list[dict]:
    """Each rank of ``folder`` measured with its rows in a store of ``budget`` bytes."""
    options = AnalyzeOptions(**kw).recorded()
    out = []
    for group in discover([folder]).groups:
        r = analyzer.analyze_group([str(f) for f in group.files], options, budget=budget)
        assert r.error is None, r.error
        out.append(msgspec.to_builtins(r.report))
    return out


@pytest.mark.parametrize("folder", [d for d in REAL if d.name != "mtia"], ids=real_data.name)
def test_store_budgets_give_one_report(folder, tmp_path, monkeypatch):
    """The rows in memory (no budget: nothing written), all on disk (0), or some of each: the
    same report, float for float."""
    made = []
    real = ST.make_folder
    monkeypatch.setattr(ST, "make_folder", lambda path: made.append(1) or real(path))
    kw = {"comm_ops": True}
    whole = _rank_reports(folder, None, **kw)
    assert not made  # the store wrote nothing
    _assert_same(whole, _rank_reports(folder, 0, **kw))
    assert made
    _assert_same(whole, _rank_reports(folder, 1 << 16, **kw))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), gpu=st.booleans(), budget=st.sampled_from([0, 1 << 12, 1 << 16]),
       sync=st.booleans())
def test_random_traces_one_report_whatever_the_budget(tmp_path_factory, seed, gpu, budget, sync):
    """Random GPU (with CUDA sync events or not) and CPU traces: the rank measured with its rows
    in a store of no limit, of ``budget`` bytes, the same report, float for float."""
    rng = random.Random(seed)
    folder = tmp_path_factory.mktemp("random")
    make = (_cuda_sync_trace if sync else _random_gpu_trace) if gpu else _random_cpu_trace
    for r in range(2):
        S.write(folder / f"rank{r}.pt.trace.json", S.trace(make(rng, steps=3), rank=r, world_size=2))
    _assert_same(_rank_reports(folder, None, comm_ops=True), _rank_reports(folder, budget, comm_ops=True))


def _reads(monkeypatch) -> list[str]:
    """The path of every read of a trace file's events from now on (any reader: the analysis's,
    or one that reads a file again for something it left out), counted at its first chunk (a
    file not in the line layout is found so before any, and read by the generic reader)."""
    from overlapprof.trace.reader import TraceReader

    seen = []
    real = TraceReader.chunks

    def chunks(self, *a, **k):
        for n, chunk in enumerate(real(self, *a, **k)):
            if n == 0:
                seen.append(self.path)
            yield chunk

    monkeypatch.setattr(TraceReader, "chunks", chunks)
    return seen


def test_each_file_is_read_once(monkeypatch):
    """The records come from the same read as the unions: each file is read once, the cross-rank
    section and --comm-ops records included."""
    seen = _reads(monkeypatch)
    folder = DATA / "nccl_parser_config"
    got = overlapprof.analyze(folder, workers=1, **ON_DISK, comm_ops=True)
    assert got.crossrank is not None and any(r.operations for r in got.ranks)
    files = [str(f) for g in discover([folder]).groups for f in g.files]
    assert sorted(seen) == sorted(files)


@pytest.mark.parametrize("budget", [None, 0])
def test_each_file_is_read_once_when_sends_end_at_the_peer(monkeypatch, tmp_path, budget):
    """An async send matched to a receive its thread waited for ends at the receive's end
    (OVERLAP.md section 1): its rank is measured again from what its one read kept, not read again
    (until 2026-12-07 it was). Rank 0: an isend [1000, 41000) with matmuls inside; rank 1: a
    blocking recv that ends at 3000."""
    def p2p(kind, ts, dur, peer):
        call = "c10d::send" if kind == "send" else "c10d::recv_"
        return [S.cpu_op(call, ts - 5, 10, args={"Concrete Inputs": ["", "", str(peer), "0"]}),
                S.annotation(f"gloo:{kind}", ts, dur, args={"Input Dims": [[1000]], "Input type": ["float"]})]

    rank0 = [S.step(1, 0, 42_000), *p2p("send", 1000, 40_000, 1),
             *(S.cpu_op("aten::mm", 1100 + 1000 * k, 900) for k in range(39))]
    rank1 = [S.step(1, 0, 42_000), *p2p("recv", 1000, 2000, 0), S.cpu_op("aten::mm", 4000, 30_000)]
    paths = [S.write(tmp_path / f"rank{r}.json", S.trace(events, rank=r, world_size=2, backend="gloo", base_ns=10**18))
             for r, events in enumerate((rank0, rank1))]
    stores, opened = [], ST.Store.__init__

    def spy(self, *a, **k):
        opened(self, *a, **k)
        stores.append(self)

    monkeypatch.setattr(ST.Store, "__init__", spy)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    seen = _reads(monkeypatch)
    got = overlapprof.analyze(paths, workers=1, memory_budget=budget, comm_ops=True)
    rank0 = next(r for r in got.ranks if r.rank == 0)
    assert rank0.p2p.ends_from_peer == 1
    assert rank0.metrics.comm_us == 2005  # [995, 1005) ∪ [1000, 3000): cut at the receive's end
    assert [r.dur for r in rank0.comm_records if r.name == "gloo:send"] == [2000]
    assert sorted(seen) == sorted(str(p) for p in paths)
    # the spans waited in the analyzing process's store: on disk at budget 0, and removed
    (kept,) = [s for s in stores if s.label == "the ranks' compute spans"]
    assert (kept.spilled > 0) == (budget == 0)
    assert not list(tmp.iterdir())


def test_whatif_micro_batches_reads_each_file_once(monkeypatch, tmp_path):
    """``micro_batches`` reads the ops' shapes (the per-call share, replay/percall.py) from the
    analysis's one read of each file, which until 2026-12-07 it read again: a 2-stage pipeline,
    each 200 µs piece a 150 µs matmul on the micro-batch's 500 rows and a 50 µs add on a [8, 8]
    weight, so a quarter of the compute is paid per micro-batch: one micro-batch gives 1800 µs on
    stage 0 and 1450 on stage 1 (the compute kept: 2000 and 1600)."""
    from overlapprof.analysis.replay.predict import whatif

    def p2p(kind, at, dur, peer):
        call = "c10d::send" if kind == "send" else "c10d::recv_"
        return [S.cpu_op(call, at, dur, args={"Concrete Inputs": ["", "", str(peer), "0"],
                                              "Input Dims": [[[500, 8]], [], [], []]}),
                S.annotation(f"gloo:{kind}", at, dur, args={"Input Dims": [[500, 8]], "Input type": ["float"]})]

    def piece(at):
        return [S.cpu_op("aten::mm", at, 150, args={"Input Dims": [[500, 8], [8, 8]]}),
                S.cpu_op("aten::add_", at + 150, 50, args={"Input Dims": [[8, 8], [8, 8], []]})]

    stage0 = [S.step(1, 0, 1600), *piece(0), *p2p("send", 200, 100, 1), *piece(300), *p2p("send", 500, 100, 1),
              *p2p("recv", 600, 500, 1), *piece(1100), *p2p("recv", 1300, 100, 1), *piece(1400)]
    stage1 = [S.step(1, 0, 1400), *p2p("recv", 0, 300, 0), *piece(300), *p2p("recv", 500, 100, 0), *piece(600),
              *piece(800), *p2p("send", 1000, 100, 0), *piece(1100), *p2p("send", 1300, 100, 0)]
    for rank, events in ((0, stage0), (1, stage1)):
        S.write(tmp_path / f"rank{rank}.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    seen = _reads(monkeypatch)
    got = whatif([str(tmp_path)], ["micro_batches=1"], workers=1).predictions[0]
    assert got.ranks == {0: pytest.approx(1800), 1: pytest.approx(1450)}
    assert sorted(seen) == sorted(str(tmp_path / f"rank{r}.json") for r in (0, 1))


def test_a_communication_call_of_no_duration(tmp_path):
    """A ``c10d::*`` call recorded with ``dur`` 0 has nothing inside it: the trace is measured, in
    memory and on disk alike (it raised an IndexError in the calls' union, a traceback)."""
    import synthetic as S

    events = [S.step(1, 0, 1000), S.cpu_op("aten::mm", 0, 400), S.cpu_op("c10d::allreduce_", 400, 0),
              S.annotation("gloo:all_reduce", 400, 300), S.cpu_op("aten::mm", 700, 300)]
    for rank in (0, 1):
        S.write(tmp_path / f"rank{rank}.json", S.trace(events, rank=rank, world_size=2, backend="gloo"))
    memory = overlapprof.analyze(tmp_path, workers=1, **IN_MEMORY)
    on_disk = overlapprof.analyze(tmp_path, workers=1, **ON_DISK)
    _assert_same(_whole(memory), _whole(on_disk))
    m = memory.ranks[0].metrics
    assert m.comm_us == pytest.approx(300) and m.compute_us == pytest.approx(700)
