"""Benchmark ``overlapprof analyze`` against HolisticTraceAnalysis and against the decoder alone.

    python benchmarks/analyze_bench.py [--quick] [--no-hta] [--skip-scale] [--skip-64] [--work DIR]
    python benchmarks/analyze_bench.py --only mtia --only big [--big-size MB]   # issue 12's inputs
    python benchmarks/analyze_bench.py --check-hta [FOLDER ...]
    python benchmarks/analyze_bench.py --gate REV [--gate-sizes 2000,4000] [--repeat N] [--out FILE]

Each measurement runs in its own fresh Python process, so peak memory is clean: the peak is the
largest sum of PSS (proportional set size: pages shared by forked workers count once) over the
process and its children, sampled with psutil every 10 ms for the first second, then every 200 ms (both overlapprof and
HTA parse ranks in forked child processes), in a run of its own: the times are of runs that do not sample
(:func:`measure`); ``ru_maxrss`` of the process itself is printed too. "wall" is the whole process (interpreter start and imports included), "work" the
analysis call alone. overlapprof's bytecode caches are written first (:func:`compile_bytecode`), as an
installed package has them. Inputs:

- ``tests/data/mtia/`` (one CPU-mode rank, 455,739 events, 83 MB of JSON, gzip),
- ``tests/data/trace_filter/`` (two GPU ranks of a 128-rank job),
- a generated multi-rank set (benchmarks/gen_traces.py, analytic overlap, checked),

then a scaling table (one rank, growing event counts: time should grow linearly), a 64-rank
generated set (must analyze on a 24 GiB machine), and one generated single-rank trace of
``--big-size`` MB of JSON (default 2000), plain and gzipped, analyzed with 1 and 2 workers (one
file decoded in pieces by worker processes, issue 12), and by HTA under a
memory cap (``--hta-mem-mb``; it is stopped there). The big trace is deleted at the end. The decoder baseline is gunzip + msgspec of the
same bytes (overlapprof's own gunzip), untyped (``msgspec.json.decode``) and typed (the struct
overlapprof decodes each event into, all events at once). "overlapprof" is the default analysis
(with the cross-rank section of issue 5); "--no-comms" the OVERLAP.md metrics alone.
On every input it times with HTA, it also checks that ``overlapprof analyze --like-hta`` gives
HTA's numbers as HTA reports them (percent rounded to 2 decimals) and prints the check;
``--check-hta`` runs that check alone on each folder of ``tests/data`` (the shared traces) and
prints a Markdown table of overlapprof vs HTA vs ``--like-hta``. Targets: ≥20x faster than HTA end
to end on mtia (issue 12; issue 3 asked 10x), ≤1/4 of its peak memory, within 2x of the typed
decoder; the big trace under 1 GiB of peak memory and ≥1.6x faster with 2 workers than with 1.
``--memory-budget 0 --no-comms`` (every rank's events on disk) is measured on the big trace too
(1 and 2 workers), and beside a trace of half its size (:func:`bounded_growth`): its peak grows
with the operations, not the events (RESULTS.md, 2026-12-05 23:33-23:41 UTC).
Benchmarks print; they do not assert.

``--gate REV`` measures issue 28's gate instead: this tree against a git worktree of ``REV``, side
by side in one run (the generated 2 GB trace's time with 2 workers, peak memory on 2 and 4 GB,
mtia against HTA, the small traces, and the golden check), one table of PASS/FAIL lines and an exit
status of 1 when one fails; ``benchmarks/gate.py`` says how each item is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gen_traces  # noqa: E402

DATA = ROOT / "tests" / "data"

_RUSAGE = (
    "import resource; _m = lambda w: resource.getrusage(w).ru_maxrss / 1024\n"
    "RES['maxrss_mb'] = _m(resource.RUSAGE_SELF); RES['children_maxrss_mb'] = _m(resource.RUSAGE_CHILDREN)\n"
    "print('@@' + json.dumps(RES))\n"
)

CHILD_OVERLAPPROF = (
    "import json, sys, time\nRES = {}\nimport overlapprof, overlapprof.analysis.analyzer\nt = time.perf_counter()\n"
    "w, comms, *flags = sys.argv[1].split(',')\n"
    "r = overlapprof.analyze(sys.argv[2:], workers=int(w) or None, comms=comms == 'comms', like_hta='like' in flags,\n"
    "                        **({'memory_budget': 0} if 'bounded' in flags else {}))\n"
    "RES['work_s'] = time.perf_counter() - t\n"
    "RES['ratios'] = {x.rank: x.metrics.overlap_ratio for x in r.ranks}\n" + _RUSAGE
)

CHILD_HTA = (
    "import json, sys, time, logging, warnings\nwarnings.filterwarnings('ignore')\nRES = {}\n"
    "from hta.trace_analysis import TraceAnalysis\nt = time.perf_counter()\n"
    "logging.disable(logging.WARNING)\n"
    "try:\n"
    "    df = TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)\n"
    "    RES['ratios'] = {int(k): (None if v != v else float(v)) for k, v in zip(df['rank'], df['comp_comm_overlap_pctg'] / 100)}\n"
    "except Exception as exc:\n"
    "    RES['error'] = f'{type(exc).__name__}: {str(exc)[:120]}'\n"
    "RES['work_s'] = time.perf_counter() - t\n" + _RUSAGE
)

CHILD_DECODER = (
    "import json, sys, time\nimport msgspec\nfrom overlapprof.trace.decode import ScanEvent, read_bytes\nRES = {}\n"
    "class Top(msgspec.Struct):\n    traceEvents: list[ScanEvent]\n"
    "dec = msgspec.json.Decoder(Top) if sys.argv[1] == 'typed' else msgspec.json.Decoder()\n"
    "t = time.perf_counter()\nn = 0\n"
    "for f in sys.argv[2:]:\n"
    "    data = read_bytes(f)\n"
    "    obj = dec.decode(data)\n"
    "    n += len(obj.traceEvents if sys.argv[1] == 'typed' else obj['traceEvents'])\n"
    "    del obj, data\n"
    "RES['work_s'] = time.perf_counter() - t\nRES['events'] = n\n" + _RUSAGE
)


REPEAT = 1  # --repeat: runs per measurement, the fastest kept (a shared machine is noisy)


def measure(code: str, args: list[str], **kw) -> dict:
    """The fastest of REPEAT runs of :func:`measure_once`, timed without sampling memory, with
    the peak of one more run that samples it. Sampling PSS every 10 ms takes a share of a core:
    on this 2-core machine that slowed 2-worker runs most (mtia, 2026-12-03: 0.52 s sampled
    against 0.41-0.45 s not, while one worker stayed at 0.46 s). A run under a memory cap is
    sampled (that is how it is stopped), and timed so."""
    capped = kw.get("mem_limit_mb") is not None
    runs = [measure_once(code, args, sample=capped, **kw) for _ in range(REPEAT)]
    ok = [r for r in runs if "work_s" in r]
    if not ok:
        return runs[-1]
    best = min(ok, key=lambda r: r["work_s"])
    if not capped:
        sampled = measure_once(code, args, **kw)
        if "error" in sampled:
            return sampled
        best["peak_mb"] = sampled["peak_mb"]
    return best


def measure_once(code: str, args: list[str], env: dict | None = None, mem_limit_mb: float | None = None,
                 timeout_s: float | None = None, sample: bool = True, python: str = sys.executable) -> dict:
    """Run ``code`` in a fresh interpreter (``python``); wall time, sampled peak tree PSS (``sample``;
    else ru_maxrss) and its own report. ``env``: added to the environment; past ``mem_limit_mb`` of
    tree PSS or ``timeout_s`` the process tree is killed and the result says so."""
    psutil = None
    if sample:
        try:
            import psutil
        except ImportError:  # the bench extra brings psutil; without it, ru_maxrss only
            pass
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    peak, stopped = 0, None
    if psutil is not None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:  # PSS: pages shared by forked workers count once, split between them
                procs = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_full_info().pss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            over = mem_limit_mb is not None and peak > mem_limit_mb * 2**20
            late = timeout_s is not None and time.perf_counter() - t0 > timeout_s
            if over or late:
                stopped = f"stopped past {mem_limit_mb:.0f} MB" if over else f"stopped after {timeout_s:.0f} s"
                for p in procs[::-1]:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                break
            # Reading a GB-sized process's PSS walks its page tables: sampled every 10 ms it took a
            # core's share from a 2-worker run on 2 cores (2 GB: 1.22x sampled, 1.67-1.86x not),
            # so after the first second, every 200 ms (a GB-scale peak lasts longer than that).
            time.sleep(0.01 if time.perf_counter() - t0 < 1.0 else 0.2)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if stopped:
        return {"wall_s": wall, "error": f"{stopped} (peak {peak / 2**20:.0f} MB)", "peak_mb": peak / 2**20}
    lines = [line for line in out.splitlines() if line.startswith("@@")]
    if proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or ["(no output)"])[-1]
        return {"wall_s": wall, "error": f"exit {proc.returncode}: {tail[:160]}"}
    res = json.loads(lines[-1][2:])
    res["wall_s"] = wall
    res["peak_mb"] = peak / 2**20 if peak else max(res["maxrss_mb"], res["children_maxrss_mb"])
    return res


def _fmt_ratios(ratios: dict | None) -> str:
    if not ratios:
        return ""
    items = sorted(ratios.items(), key=lambda kv: int(kv[0]))
    shown = ", ".join(f"{k}: {'-' if v is None else f'{100 * v:.2f}%'}" for k, v in items[:4])
    return shown + (f", ... ({len(items)} ranks)" if len(items) > 4 else "")


def _row(name, res):
    if "error" in res and "work_s" not in res:
        return f"  {name:<22} {'failed':>8}  {res['error']}"
    extra = res.get("error") or _fmt_ratios(res.get("ratios"))
    return (f"  {name:<22} {res['wall_s']:8.2f} {res['work_s']:8.2f} {res['peak_mb']:9.0f} {res['maxrss_mb']:9.0f}"
            f"  {extra}")


def trace_files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))


def compare(label: str, folder: Path, hta: bool) -> dict:
    files = trace_files(folder)
    size = sum(Path(f).stat().st_size for f in files)
    print(f"\n== {label}: {len(files)} file(s), {size / 1e6:.1f} MB on disk ({folder})")
    print(f"  {'':<22} {'wall s':>8} {'work s':>8} {'peak MB':>9} {'maxrss':>9}  overlap ratio per rank")
    runs = {
        "decoder (untyped)": measure(CHILD_DECODER, ["untyped", *files]),
        "decoder (typed)": measure(CHILD_DECODER, ["typed", *files]),
        "overlapprof": measure(CHILD_OVERLAPPROF, ["0,comms", str(folder)]),
        "overlapprof -w1": measure(CHILD_OVERLAPPROF, ["1,comms", str(folder)]),
        "overlapprof --no-comms": measure(CHILD_OVERLAPPROF, ["0,none", str(folder)]),
    }
    if hta:
        runs["HTA 0.5.0"] = measure(CHILD_HTA, [str(folder)])
    for name, res in runs.items():
        print(_row(name, res))
    ours, dec = runs["overlapprof"], runs["decoder (typed)"]
    if "events" in dec:
        print(f"  events: {dec['events']:,}")
    one = runs["overlapprof -w1"]
    if "work_s" in ours and "work_s" in one:
        print(f"  speedup over 1 worker: {one['wall_s'] / ours['wall_s']:.2f}x end to end "
              f"({one['work_s'] / ours['work_s']:.2f}x on the work alone)")
    if "work_s" in ours and "work_s" in dec:
        print(f"  overlapprof / typed decoder: {ours['work_s'] / dec['work_s']:.2f}x the time "
              f"(1 worker: {runs['overlapprof -w1']['work_s'] / dec['work_s']:.2f}x)  [target ≤ 2x]")
    h = runs.get("HTA 0.5.0")
    if h is not None:
        check_like_hta(folder, h, ours)
        if "ratios" in h and "work_s" in ours:
            print(f"  HTA / overlapprof: {h['wall_s'] / ours['wall_s']:.1f}x faster end to end "
                  f"({h['work_s'] / ours['work_s']:.1f}x on the work alone)  [target ≥ 20x on mtia (issue 12)]; "
                  f"peak memory {ours['peak_mb'] / h['peak_mb']:.2f} of HTA's  [target ≤ 0.25]")
        else:
            print(f"  HTA could not analyze this input: {h.get('error')}")
    return runs


def _at(ratios: dict | None, rank: int, missing="-"):
    """A rank's ratio from a child's report (JSON keys are strings)."""
    ratios = ratios or {}
    return ratios.get(str(rank), ratios.get(rank, missing))


def check_like_hta(folder: Path, h: dict, ours: dict | None = None) -> bool | None:
    """Does ``--like-hta`` give HTA's numbers as HTA reports them (percent, 2 decimals) on every
    rank? Prints one line per rank (ours, HTA, --like-hta) and the verdict; None if HTA failed."""
    from overlapprof.analysis.like_hta import hta_percent

    if "ratios" not in h:
        print(f"  --like-hta check: HTA could not analyze this input ({h.get('error')})")
        return None
    like = measure(CHILD_OVERLAPPROF, ["1,none,like", str(folder)])
    if "ratios" not in like:
        print(f"  --like-hta check: FAILED, overlapprof --like-hta: {like.get('error')}")
        return False
    ours = ours or {}
    fmt = lambda v: "NaN" if v is None else f"{v:.2f}%"  # noqa: E731
    got = {int(k): hta_percent(v) for k, v in like["ratios"].items()}
    want = {int(k): hta_percent(v) for k, v in h["ratios"].items()}
    print(f"  --like-hta check {'rank':>6} {'ours':>9} {'HTA':>9} {'--like-hta':>11}")
    for rank in sorted(set(got) | set(want)):
        o = _at(ours.get("ratios"), rank, None)
        print(f"  {'':<16} {rank:>6} {fmt(hta_percent(o)) if ours.get('ratios') else '':>9} "
              f"{fmt(want.get(rank)) if rank in want else 'absent':>9} {fmt(got.get(rank)) if rank in got else 'absent':>11}")
    ok = got == want
    print(f"  --like-hta equals HTA 0.5.0 on every rank: {'yes' if ok else 'NO'}")
    return ok


def check_all(folders: list[Path]) -> None:
    """--check-hta: the --like-hta check on each folder (no timing), and a Markdown table of it."""
    from overlapprof.analysis.like_hta import hta_percent

    rows, verdicts = [], []
    for folder in folders:
        print(f"\n== {folder.name}")
        ours = measure(CHILD_OVERLAPPROF, ["1,none", str(folder)])
        h = measure(CHILD_HTA, [str(folder)])
        ok = check_like_hta(folder, h, ours)
        verdicts.append(ok)
        like = measure(CHILD_OVERLAPPROF, ["1,none,like", str(folder)]) if ok is not None else {}
        fmt = lambda v: "NaN" if v is None else f"{v:.2f} %"  # noqa: E731
        for rank in sorted(int(k) for k in (ours.get("ratios") or {})):
            o, hv, lv = _at(ours["ratios"], rank, None), _at(h.get("ratios"), rank), _at(like.get("ratios"), rank)
            rows.append(f"| {folder.name} | {rank} | {fmt(hta_percent(o)) if o is not None else '– (no comm)'} | "
                        f"{fmt(hta_percent(hv)) if hv != '-' else 'fails' if 'error' in h else 'absent'} | {fmt(hta_percent(lv)) if lv != '-' else '-'} |")
    print("\n| trace | rank | overlapprof | HTA 0.5.0 | `--like-hta` |\n|---|---|---|---|---|")
    print("\n".join(rows))
    checked = [v for v in verdicts if v is not None]
    print(f"\n--like-hta equals HTA on {sum(checked)} of {len(checked)} inputs HTA accepts "
          f"({len(verdicts) - len(checked)} it refuses)")


def check_generated(folder: Path, res: dict) -> None:
    want = json.loads((folder / "expected.txt").read_text())["ranks"]
    got = res.get("ratios") or {}
    bad = [r for r, w in want.items() if got.get(r) is None or abs(got[r] - w["overlap_ratio"]) > 1e-9]
    print(f"  analytic overlap ratios reproduced: {'yes' if not bad else f'NO (ranks {bad})'}")


def scaling(work: Path, sizes: list[int]) -> None:
    print("\n== scaling: one rank, growing event counts (overlapprof, 1 worker)")
    print(f"  {'events':>10} {'MB':>8} {'work s':>8} {'µs/event':>9} {'peak MB':>8}")
    for n in sizes:
        folder = work / f"scale-{n}"
        if not folder.exists():
            gen_traces.generate(folder, ranks=1, events=n)
        mb = sum(Path(f).stat().st_size for f in trace_files(folder)) / 1e6
        res = measure(CHILD_OVERLAPPROF, ["1,comms", str(folder)])
        if "work_s" not in res:
            print(f"  {n:>10,} failed: {res.get('error')}")
            continue
        events = gen_traces.EVENTS_PER_BLOCK * (n // gen_traces.EVENTS_PER_BLOCK)
        print(f"  {events:>10,} {mb:8.0f} {res['work_s']:8.2f} {1e6 * res['work_s'] / events:9.2f} {res['peak_mb']:8.0f}")


def big_trace(work: Path, size_mb: float, hta: bool, hta_mem_mb: float, hta_timeout_s: float) -> None:
    """Issue 12: one generated single-rank trace of ``size_mb`` MB of JSON, plain and gzipped:
    1 vs 2 workers, and HTA under a memory cap."""
    folder = work / f"big-{size_mb:.0f}mb"
    plain, packed = folder / "plain", folder / "gzip"
    try:
        t = time.perf_counter()
        gen_traces.generate_size(plain, int(size_mb * 1e6))
        gen_traces.generate_size(packed, int(size_mb * 1e6), compress=True)
        print(f"\n(generated the {size_mb:.0f} MB trace, plain and gzipped, in {time.perf_counter() - t:.0f} s)")
        for label, d in (("plain JSON", plain), ("gzip", packed)):
            files = trace_files(d)
            size = sum(Path(f).stat().st_size for f in files)
            print(f"\n== one rank, {size_mb:.0f} MB of JSON, {label}: {size / 1e6:.1f} MB on disk")
            print(f"  {'':<22} {'wall s':>8} {'work s':>8} {'peak MB':>9} {'maxrss':>9}  speedup over 1 worker (wall, work)")
            runs = {"overlapprof -w1": measure(CHILD_OVERLAPPROF, ["1,comms", str(d)]),
                    "overlapprof -w2": measure(CHILD_OVERLAPPROF, ["2,comms", str(d)])}
            for w in (1, 2):
                runs[f"bounded --no-comms -w{w}"] = measure(CHILD_OVERLAPPROF, [f"{w},none,bounded", str(d)])
            if hta:
                runs["HTA 0.5.0"] = measure_once(CHILD_HTA, [str(d)], mem_limit_mb=hta_mem_mb, timeout_s=hta_timeout_s)
            one = runs["overlapprof -w1"]
            for name, res in runs.items():
                line = _row(name, res)
                if name == "bounded --no-comms -w2" and "work_s" in res and "work_s" in runs["bounded --no-comms -w1"]:
                    b1 = runs["bounded --no-comms -w1"]
                    line += f"  {b1['wall_s'] / res['wall_s']:.2f}x, {b1['work_s'] / res['work_s']:.2f}x over its -w1"
                if name.startswith("overlapprof -w2") and "work_s" in res and "work_s" in one:
                    line += f"  {one['wall_s'] / res['wall_s']:.2f}x, {one['work_s'] / res['work_s']:.2f}x"
                    line += f"  [target ≥ 1.6x]; peak {res['peak_mb']:.0f} MB [target < 1024]"
                print(line)
            h = runs.get("HTA 0.5.0")
            best = min((r for n, r in runs.items() if n.startswith("overlapprof -w2") and "work_s" in r),
                       key=lambda r: r["wall_s"], default=None)
            if h is not None and best is not None and "ratios" in h:
                print(f"  HTA / overlapprof -w2: {h['wall_s'] / best['wall_s']:.1f}x faster end to end; "
                      f"peak memory {best['peak_mb'] / h['peak_mb']:.2f} of HTA's")
            elif h is not None:
                print(f"  HTA did not finish: {h.get('error')}")
            want = json.loads((d / "expected.txt").read_text())["ranks"]["0"]["overlap_ratio"]
            same = {json.dumps(r.get("ratios")) for r in runs.values() if "ratios" in r and r is not h}
            print(f"  overlap ratio {want:.2%} expected; every overlapprof run agrees with it: "
                  f"{'yes' if same == {json.dumps({'0': want})} else f'NO {same}'}")
            if label == "plain JSON":
                bounded_growth(folder / "half", size_mb, runs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bounded_growth(half: Path, size_mb: float, full: dict) -> None:
    """Issue 12's bounded memory: the peaks on a trace of half the size beside ``full``'s (the
    runs of the plain trace). On disk the peak grows with the operations (the unions' runs; less
    than 2 on the operation-dense generated trace), in memory with the events (about 2)."""
    gen_traces.generate_size(half, int(size_mb * 1e6 / 2))
    try:
        print(f"\n== peak memory, {size_mb / 2:.0f} MB of JSON vs {size_mb:.0f} MB (plain)")
        print(f"  {'':<22} {'half MB':>9} {'full MB':>9} {'full/half':>9}")
        for name, args in (("overlapprof -w2", "2,comms"), ("overlapprof --no-comms", "2,none"),
                           ("bounded --no-comms -w2", "2,none,bounded")):
            res = measure(CHILD_OVERLAPPROF, [args, str(half)])
            big = full.get(name) or measure(CHILD_OVERLAPPROF, [args, str(half.parent / "plain")])
            if "peak_mb" not in res or "peak_mb" not in big:
                print(f"  {name:<22} failed: {res.get('error') or big.get('error')}")
                continue
            note = "  [on disk: grows with the operations]" if "bounded" in name else ""
            print(f"  {name:<22} {res['peak_mb']:9.0f} {big['peak_mb']:9.0f} {big['peak_mb'] / res['peak_mb']:9.2f}{note}")
    finally:
        shutil.rmtree(half, ignore_errors=True)


def compile_bytecode() -> None:
    """Write overlapprof's bytecode caches, as ``pip install`` does for HTA and every other
    installed package: an editable install under ``PYTHONDONTWRITEBYTECODE=1`` (this machine's
    environment) has none, and every measured process would compile the package from source
    (about 35 ms of a 0.5 s analysis)."""
    import compileall

    compileall.compile_dir(str(ROOT / "overlapprof"), quiet=1)


def _sizes(text: str) -> list[float]:
    try:
        sizes = [float(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes in MB, comma-separated (2000,4000)")
    return sizes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller generated sets")
    p.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument("--skip-64", action="store_true")
    p.add_argument("--work", type=Path, default=None, help="where generated traces go (default: a temp dir)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per measurement: the fastest is kept (default 1); with --gate, their median (default 5)")
    p.add_argument("--only", action="append", choices=["mtia", "trace_filter", "generated", "scale", "64", "big"],
                   help="run only these sections (repeatable)")
    p.add_argument("--big-size", type=float, default=2000, metavar="MB",
                   help="JSON text of the big single-rank trace (default 2000; 0: skip it)")
    p.add_argument("--hta-mem-mb", type=float, default=6000, help="HTA on the big trace is stopped past this much memory")
    p.add_argument("--hta-timeout", type=float, default=900, help="... or after this many seconds")
    p.add_argument("--check-hta", nargs="*", type=Path, metavar="FOLDER", default=None,
                   help="only the --like-hta check against HTA, on these folders (default: each folder of tests/data)")
    p.add_argument("--gate", metavar="REV", help="issue 28's gate: this tree against a worktree of REV (see gate.py)")
    p.add_argument("--gate-sizes", type=_sizes, default=[2000.0, 4000.0], metavar="MB,MB",
                   help="--gate: the generated traces, MB of JSON (default 2000,4000); the first is timed")
    p.add_argument("--keep", action="store_true", help="--gate: keep the generated traces in --work")
    p.add_argument("--out", type=Path, help="--gate: also write the table (Markdown) here")
    p.add_argument("--hta-python", default=sys.executable, metavar="PYTHON",
                   help="--gate: the interpreter that runs HTA (default this one)")
    p.add_argument("--gate-ignore", action="append", default=[], metavar="JSONPATH",
                   help="--gate: a path the golden check leaves out ($.options.bounded_memory); repeatable")
    p.add_argument("--gate-budget", metavar="SIZE", default=None,
                   help="--gate: items 1-2 with --memory-budget SIZE in both trees (issue 36: the traces past "
                        "the budget; time at most 0.6x, peak at most 400 MB)")
    a = p.parse_args(argv)
    if a.gate is not None:
        import gate

        sys.exit(gate.run(a.gate, a.gate_sizes, max(1, a.repeat or 5), a.work, a.keep, a.out, a.hta_python,
                          frozenset(a.gate_ignore), a.gate_budget))
    if a.check_hta is not None:
        check_all(a.check_hta or sorted(d for d in DATA.iterdir() if d.is_dir() and trace_files(d)))  # Kineto JSON
        return
    global REPEAT
    REPEAT = max(1, a.repeat or 1)
    hta = not a.no_hta
    if hta:
        try:
            import hta as _  # noqa: F401
        except ImportError:
            print("HolisticTraceAnalysis is not installed (pip install -e '.[bench]'): comparing without it")
            hta = False
    compile_bytecode()
    work = a.work or Path(tempfile.mkdtemp(prefix="overlapprof-bench-"))
    ranks, events = (4, 50_000) if a.quick else (8, 200_000)
    want = lambda name: a.only is None or name in a.only  # noqa: E731
    if want("mtia"):
        compare("mtia (83 MB JSON, CPU mode)", DATA / "mtia", hta)
    if want("trace_filter"):
        compare("trace_filter (2 GPU ranks)", DATA / "trace_filter", hta)
    if want("generated"):
        gen = work / f"gen-{ranks}x{events}"
        if not gen.exists():
            gen_traces.generate(gen, ranks=ranks, events=events)
        runs = compare(f"generated: {ranks} ranks x {events:,} events", gen, hta)
        check_generated(gen, runs["overlapprof"])
    if want("big") and a.big_size > 0:
        big_trace(work, a.big_size, hta, a.hta_mem_mb, a.hta_timeout)
    if not a.skip_scale and want("scale"):
        sizes = [25_000, 50_000, 100_000, 200_000] if a.quick else [100_000, 200_000, 400_000, 800_000, 1_600_000]
        scaling(work, sizes)
    if not a.skip_64 and want("64"):
        n64 = 20_000 if a.quick else 100_000
        folder = work / f"gen-64x{n64}"
        if not folder.exists():
            gen_traces.generate(folder, ranks=64, events=n64)
        res = measure(CHILD_OVERLAPPROF, ["0,comms", str(folder)])
        mb = sum(Path(f).stat().st_size for f in trace_files(folder)) / 1e6
        print(f"\n== 64 ranks x {n64:,} events ({mb:.0f} MB of JSON), default workers")
        if "work_s" in res:
            print(f"  analyzed {len(res['ratios'])} ranks in {res['work_s']:.1f} s, peak memory {res['peak_mb']:.0f} MB "
                  f"(all processes), {res['maxrss_mb']:.0f} MB in the parent")
            check_generated(folder, res)
        else:
            print(f"  FAILED: {res.get('error')}")
    print(f"\ngenerated traces are in {work}")


if __name__ == "__main__":
    main()
