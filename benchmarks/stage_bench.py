"""Where ``overlapprof.analyze`` spends its time, stage by stage, against the decoder's own speed.

    python benchmarks/stage_bench.py [--repeat N] [--gen-mb MB] [--clock wall|cpu] [FOLDER ...]

One rank at a time, one worker (the stages run in this process, in order), after one run that
warms the caches; each stage's time is the median over ``--repeat`` runs. The stages are timed
by wrapping the functions that bound them (their module attributes, wherever imported), so a
stage is the time inside its function less the stages nested in it:

- decode: reading, inflating and decoding the chunks of events (the reader's generator);
- columns: the chunk's events into columns (categories, names, threads, correlations, times);
- records (chunks): the communication recorder's share of each chunk (the args it shares with
  the columns are decoded in columns: ``rank/chunk_args``);
- store: each chunk's rows into the rank's store (``spilled.SpilledRows.append``: the steps,
  calls and syncs kept, the GPU rows and CPU ops in the store's bins, in memory or on disk);
- join: each GPU event joined to its launch, and the events and the calls into time buckets
  (``spilled.joined_by_time``, ``calls_by_time``);
- classify: the buckets classified into communication, compute and memory, steps, kinds, and
  their unions built (the rest of ``bounded.measure``);
- records (built): the communication records' table (``bucket_records``; for an export, the
  recorder's ``records``);
- export read: an Nsight Systems export's rows (``events.rank_events``, which reads exports
  only: its read and scan; its classification is in classify);
- metrics: the rank's report (steps, kinds, partition, timeline) from the unions;
- exposure (rank): the rank's share of the causes of exposure; cross-rank: the cross-rank
  section; causes: the causes of exposure and the bound; the rest: discovery, checks, the
  report's assembly.

Beside it, the decoder alone on the same bytes: the file read (and gunzipped, overlapprof's own
gunzip), then ``msgspec`` decoding it whole, untyped and typed (the struct overlapprof decodes
each event into). Inputs: the folders given (default ``tests/data/mtia``) and, with
``--gen-mb``, a generated operation-dense trace of that many MB of JSON (``gen_traces``).
``--clock cpu`` times with this process's CPU time instead of the wall clock (steadier on a shared
machine; the decoder is one thread). Benchmarks print; they do not assert.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import gen_traces  # noqa: E402

import msgspec  # noqa: E402

import overlapprof  # noqa: E402
from overlapprof.analysis import analyzer  # noqa: E402,F401 - loaded, so that its imports are wrapped too
from overlapprof.trace.decode import ScanEvent, read_bytes  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)

# (stage, module, attribute): the functions whose time is taken (inclusive)
FUNCTIONS = [
    ("analyze", "overlapprof.analysis.analyzer", "analyze"),
    ("analyze_group", "overlapprof.analysis.analyzer", "analyze_group"),
    ("measure", "overlapprof.analysis.rank.bounded", "measure"),
    ("read_spilled", "overlapprof.analysis.rank.spilled", "read_spilled"),
    ("joined_by_time", "overlapprof.analysis.rank.spilled", "joined_by_time"),
    ("calls_by_time", "overlapprof.analysis.rank.spilled", "calls_by_time"),
    ("tables", "overlapprof.analysis.rank.bucket_records", "gpu_table"),
    ("tables", "overlapprof.analysis.rank.bucket_records", "cpu_table"),
    ("rank_events", "overlapprof.analysis.rank.events", "rank_events"),
    ("read_scan", "overlapprof.analysis.rank.read", "read_scan"),
    ("rank_unions", "overlapprof.analysis.rank.unions", "rank_unions"),
    ("rank_report", "overlapprof.analysis.rank.metrics", "rank_report"),
    ("exposure_input", "overlapprof.analysis.exposure.inputs", "exposure_input"),
    ("crossrank_input", "overlapprof.analysis.crossrank.inputs", "crossrank_input"),
    ("build_crossrank", "overlapprof.analysis.crossrank.section", "build_crossrank"),
    ("explain", "overlapprof.analysis.exposure", "explain"),
]
METHODS = [("records_raw", "overlapprof.analysis.records.recorder", "CommRecorder", "add_raw"),
           ("records_decoded", "overlapprof.analysis.records.recorder", "CommRecorder", "add_decoded"),
           ("records_built", "overlapprof.analysis.records.recorder", "CommRecorder", "records"),
           ("store", "overlapprof.analysis.rank.spilled", "SpilledRows", "append")]
CLOCK = time.perf_counter  # --clock cpu: time.process_time


INSIDE: list[str] = []  # the timed functions running, outermost first


def _timed(name: str, fn):
    def wrapper(*args, **kw):
        INSIDE.append(name)
        t = CLOCK()
        try:
            return fn(*args, **kw)
        finally:
            spent = CLOCK() - t
            INSIDE.pop()
            SPENT[name] += spent
            if name == "records_built" and "tables" in INSIDE:  # already in the tables' time
                SPENT["records_built_in_tables"] += spent

    return wrapper


def _timed_chunks(chunks):
    """The reader's ``chunks``, timed inside each ``next``: reading, inflating and decoding."""

    def wrapper(self, *args, **kw):
        it = chunks(self, *args, **kw)
        while True:
            t = CLOCK()
            try:
                chunk = next(it)
            except StopIteration:
                SPENT["decode"] += CLOCK() - t
                return
            SPENT["decode"] += CLOCK() - t
            yield chunk

    return wrapper


def install() -> None:
    """Wrap every function of :data:`FUNCTIONS` wherever a loaded overlapprof module holds it."""
    import importlib

    for name, module, attr in FUNCTIONS:
        original = getattr(importlib.import_module(module), attr)
        wrapped = _timed(name, original)
        for mod in [m for k, m in sys.modules.items() if k.startswith("overlapprof") and m is not None]:
            for key, value in list(vars(mod).items()):
                if value is original:
                    setattr(mod, key, wrapped)
    for name, module, cls, attr in METHODS:
        klass = getattr(importlib.import_module(module), cls)
        setattr(klass, attr, _timed(name, getattr(klass, attr)))
    from overlapprof.trace.reader import TraceReader

    TraceReader.chunks = _timed_chunks(TraceReader.chunks)


def stages(s: dict[str, float]) -> dict[str, float]:
    """Exclusive times from the inclusive ones. A Kineto trace is measured by ``bounded.measure``
    (read into the store, joined, classified a bucket at a time); an Nsight Systems export by
    ``events.rank_events`` (read whole, classified) and ``unions.rank_unions``."""
    g = lambda k: s.get(k, 0.0)  # noqa: E731
    chunks = g("records_raw") + g("records_decoded")
    join = g("joined_by_time") + g("calls_by_time")
    export_records = g("records_built") - g("records_built_in_tables")
    export_read = g("read_scan") - export_records
    metrics = g("rank_unions") + g("rank_report")
    return {
        "decode": g("decode"),
        "columns": g("read_spilled") - g("decode") - chunks - g("store"),
        "records (chunks)": chunks,
        "store": g("store"),
        "join": join,
        "classify": g("measure") - g("read_spilled") - join - g("tables") + g("rank_events") - g("read_scan"),
        "records (built)": g("tables") + export_records,
        "export read": export_read,
        "metrics": metrics,
        "exposure (rank)": g("exposure_input"),
        "rest of the rank": g("analyze_group") - g("measure") - g("rank_events") - metrics - g("exposure_input"),
        "cross-rank": g("build_crossrank"),
        "causes": g("explain"),
        "rest": g("analyze") - g("analyze_group") - g("build_crossrank") - g("explain"),
        "total": g("analyze"),
    }


class Top(msgspec.Struct):
    traceEvents: list[ScanEvent]


def decoder(files: list[str]) -> dict[str, float]:
    out = {}
    t = CLOCK()
    data = [read_bytes(f) for f in files]
    out["read + gunzip"] = CLOCK() - t
    for label, dec in (("msgspec untyped", msgspec.json.Decoder()), ("msgspec typed", msgspec.json.Decoder(Top))):
        t = CLOCK()
        for d in data:
            dec.decode(d)
        out[label] = CLOCK() - t
        gc.collect()
    out["bytes"] = sum(len(d) for d in data)
    return out


def measure(label: str, folder: Path, repeat: int) -> None:
    runs = []
    for k in range(repeat + 1):
        SPENT.clear()
        gc.collect()
        overlapprof.analyze([str(folder)], workers=1)
        if k:  # the first run warms the caches
            runs.append(stages(SPENT))
    med = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    files = sorted(str(p) for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    dec = [decoder(files) for _ in range(repeat)]
    base = {name: statistics.median(d[name] for d in dec) for name in dec[0]}
    mb = base["bytes"] / 1e6
    print(f"\n== {label}: {mb:.0f} MB of JSON, one worker, median of {repeat}")
    total = med["total"]
    for name, value in med.items():
        print(f"  {name:<20} {value:7.3f} s  {100 * value / total:5.1f}%")
    print(f"  decoder alone:       read + gunzip {base['read + gunzip']:.3f} s; msgspec untyped "
          f"{base['msgspec untyped']:.3f} s, typed {base['msgspec typed']:.3f} s ({mb / base['msgspec typed']:.0f} MB/s)")
    floor = base["read + gunzip"] + base["msgspec typed"]
    print(f"  analyze / (read + typed decode): {total / floor:.2f}x; overlapprof's decode stage / that: "
          f"{med['decode'] / floor:.2f}x")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="*", type=Path, default=[ROOT / "tests" / "data" / "mtia"])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--gen-mb", type=float, help="also a generated single-rank trace of this many MB of JSON")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    a = p.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if a.clock == "cpu" else time.perf_counter
    install()
    for folder in a.folders:
        measure(str(folder), folder, a.repeat)
    if a.gen_mb:
        work = Path(tempfile.mkdtemp(prefix="stage-bench-"))
        try:
            gen_traces.generate_size(work, int(a.gen_mb * 1e6))
            measure(f"generated {a.gen_mb:.0f} MB", work, a.repeat)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
