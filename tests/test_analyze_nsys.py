"""`overlapprof analyze` on Nsight Systems SQLite exports (issue 38): the two real exports of
tests/data/nsys checked, rank by rank and step by step, against a reference computed here from
SQL alone (its own queries, its own interval unions in integer nanoseconds: none of overlapprof's
code), exact to the nanosecond; the CLI end to end; bad input refused in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from overlapprof import analyze

DATA = Path(__file__).parent / "data" / "nsys"
H100 = DATA / "h100_2gpu_1s.sqlite"  # two GPUs, no NCCL kernel in the window
MFU = DATA / "mfu_2gpu_before.sqlite"  # two ranks, NCCL SendRecv kernels on the compute stream
CLI = [sys.executable, "-m", "overlapprof"]


# ---- the reference: SQL and plain Python ------------------------------------------------------

def union(intervals):
    """Sorted disjoint [a, b) of integer intervals."""
    out = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(u):
    return sum(b - a for a, b in u)


def intersection(u, v):
    i = j = total = 0
    while i < len(u) and j < len(v):
        lo, hi = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        total += max(0, hi - lo)
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def measures(comm, compute):
    """comm, compute, overlapped, exposed (ns) of lists of intervals, OVERLAP.md section 2."""
    uc, up = union(comm), union(compute)
    overlapped = intersection(uc, up)
    return {"comm": length(uc), "compute": length(up), "overlapped": overlapped, "exposed": length(uc) - overlapped}


def nvtx_name(text):
    m = re.match(r"^(.*?), (?:seq|op_id) = ", text)
    return m.group(1) if m else text


def reference(path, step_range=None):
    """Per GPU process (ordered by device, then pid): the whole capture's and each step's
    measures, in ns, from the export's tables alone."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    q = lambda sql, *p: con.execute(sql, p).fetchall()  # noqa: E731
    procs = q("select globalPid, min(deviceId) d from (select globalPid, deviceId from CUPTI_ACTIVITY_KIND_KERNEL "
              "union all select globalPid, deviceId from CUPTI_ACTIVITY_KIND_MEMCPY union all select globalPid, "
              "deviceId from CUPTI_ACTIVITY_KIND_MEMSET) group by globalPid")
    procs.sort(key=lambda r: (r[1], (r[0] >> 24) & 0xFFFFFF))
    out = []
    for gp, _ in procs:
        acts = q("select 'k', k.start, k.end, k.correlationId, s.value from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds "
                 "s on s.id = k.demangledName where k.globalPid = ? union all select 'm', start, end, correlationId, '' "
                 "from CUPTI_ACTIVITY_KIND_MEMCPY where globalPid = ? union all select 'm', start, end, correlationId, "
                 "'' from CUPTI_ACTIVITY_KIND_MEMSET where globalPid = ?", gp, gp, gp)
        launches = {c: (s, t) for s, t, c in q("select start, globalTid, correlationId from CUPTI_ACTIVITY_KIND_RUNTIME "
                                               "where globalTid >> 24 = ? >> 24", gp)}
        ranges = [(s, e, t, nvtx_name(n)) for s, e, t, n in q(
            "select n.start, n.end, n.globalTid, coalesce(n.text, s.value) from NVTX_EVENTS n left join StringIds s on "
            "s.id = n.textId where n.end is not null and n.globalTid >> 24 = ? >> 24", gp)]
        calls = [r for r in ranges if r[3] == "record_param_comms" or r[3].startswith("c10d::")]
        steps = sorted((s, e) for s, e, _, n in ranges if n == step_range)
        events = []  # (interval, is comm, anchor: its launch's start, else its own)
        for kind, start, end, corr, name in acts:
            launch = launches.get(corr)
            inside = launch is not None and any(t == launch[1] and s <= launch[0] < e for s, e, t, _ in calls)
            if kind == "k" or inside:  # memory (copies, memsets not inside a call) is not checked here
                events.append(((start, end), bool(re.search("nccl|rccl", name, re.I)) or inside,
                               launch[0] if launch else start))
        whole = measures([iv for iv, c, _ in events if c], [iv for iv, c, _ in events if not c])
        per_step = []
        for s, e in steps:
            mine = [(iv, c) for iv, c, a in events if s <= a < e]
            per_step.append(measures([iv for iv, c in mine if c], [iv for iv, c in mine if not c]))
        out.append({"whole": whole, "steps": per_step})
    con.close()
    return out


def ns(us: float) -> int:
    return round(us * 1000)


def check(report, ref):
    assert len(report.ranks) == len(ref)
    for rank, want in zip(report.ranks, ref):
        m = rank.metrics
        got = {"comm": ns(m.comm_us), "compute": ns(m.compute_us), "overlapped": ns(m.overlapped_us),
               "exposed": ns(m.exposed_comm_us)}
        assert got == want["whole"], rank.rank
        assert len(rank.steps) == len(want["steps"])
        for step, w in zip(rank.steps, want["steps"]):
            got = {"comm": ns(step.comm_us), "compute": ns(step.compute_us), "overlapped": ns(step.overlapped_us),
                   "exposed": ns(step.exposed_comm_us)}
            assert got == w, (rank.rank, step.step)


# ---- the real exports ----------------------------------------------------------------------------

def test_two_ranks_with_nccl_on_the_compute_stream_match_the_sql_reference_to_the_ns():
    ref = reference(MFU)
    assert all(r["whole"]["comm"] > 0 for r in ref)  # the reference sees the NCCL kernels
    report = analyze(MFU, workers=1)
    check(report, ref)
    assert [r.rank for r in report.ranks] == [0, 1] and [r.mode for r in report.ranks] == ["gpu", "gpu"]
    assert report.ranks[0].files == [f"{MFU}#pid=144"]  # device 0's process first
    # NCCL runs on the compute stream: nothing overlaps, all of it is exposed
    assert all(r.metrics.overlapped_us == 0 and r.metrics.exposed_comm_us > 0 for r in report.ranks)
    # issued by c10d::alltoall_base_ (emit_nvtx ranges): all_to_all, matched across ranks by order
    kinds = {k.kind for r in report.ranks for k in r.kinds}
    assert "all_to_all" in kinds
    assert any("3.25.0" in w for w in report.warnings)  # the export's schema is named
    assert any("bytes and peers of communication are missing" in w for w in report.warnings)
    matched = {m.kind: m for m in report.crossrank.matching}
    assert len(report.crossrank.instances) >= 30 and "all_to_all" in matched


def test_steps_from_an_nvtx_range_match_the_sql_reference_to_the_ns():
    ref = reference(MFU, "AllToAll4D")
    assert all(len(r["steps"]) >= 30 for r in ref)
    check(analyze(MFU, workers=1, step_range="AllToAll4D"), ref)
    ref = reference(H100, "aten::linear")
    check(analyze(H100, workers=1, step_range="aten::linear"), ref)


def test_two_gpus_without_nccl_match_the_sql_reference():
    ref = reference(H100)
    report = analyze(H100, workers=1)
    check(report, ref)
    assert all(r.metrics.comm_us == 0 and r.metrics.overlap_ratio is None for r in report.ranks)
    assert all(r.metrics.compute_us > 0 and r.metrics.memory_us > 0 for r in report.ranks)


def test_one_file_per_rank_gives_the_ranks_of_one_file(tmp_path):
    """The export split in two, one process each (nsys run inside the launcher, %q{RANK} in the
    name): the same ranks, measures and matched collectives as the file with both."""
    parts = []
    for rank, (keep, drop) in enumerate(((144, 145), (145, 144))):
        path = tmp_path / f"rank{rank}.sqlite"
        shutil.copy(MFU, path)
        path.chmod(0o644)
        con = sqlite3.connect(path)
        gp = con.execute("select globalPid from PROCESSES where pid = ?", (drop,)).fetchone()[0]
        for t in ("KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION"):
            con.execute(f"delete from CUPTI_ACTIVITY_KIND_{t} where globalPid = ?", (gp,))
        con.execute("delete from CUPTI_ACTIVITY_KIND_RUNTIME where globalTid >> 24 = ? >> 24", (gp,))
        con.execute("delete from NVTX_EVENTS where globalTid >> 24 = ? >> 24", (gp,))
        con.commit()
        con.close()
        parts.append(path)
    split = analyze(parts[::-1], workers=1)  # given in any order: the file names say the ranks
    whole = analyze(MFU, workers=1)
    assert [(r.rank, r.rank_source, r.files) for r in split.ranks] == [(0, "file name", [str(parts[0])]),
                                                                      (1, "file name", [str(parts[1])])]
    assert [r.metrics for r in split.ranks] == [r.metrics for r in whole.ranks]
    assert [r.kinds for r in split.ranks] == [r.kinds for r in whole.ranks]
    assert len(split.crossrank.instances) == len(whole.crossrank.instances) >= 30


def test_rank_map_names_the_ranks():
    report = analyze(MFU, workers=1, rank_map="144=1,145=0")
    assert [(r.rank, r.files[0].rsplit("=", 1)[1]) for r in report.ranks] == [(0, "145"), (1, "144")]
    default = analyze(MFU, workers=1)
    assert report.ranks[0].metrics == default.ranks[1].metrics


# ---- the CLI end to end --------------------------------------------------------------------------

def test_cli_analyze_json_by_step_and_export_of_an_export(tmp_path):
    out = tmp_path / "r.json"
    run = subprocess.run([*CLI, "analyze", str(MFU), "--json", str(out), "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    saved = json.loads(out.read_text())
    assert [r["rank"] for r in saved["ranks"]] == [0, 1]
    assert round(saved["ranks"][0]["metrics"]["comm_us"] * 1000) == reference(MFU)[0]["whole"]["comm"]
    run = subprocess.run([*CLI, "analyze", str(MFU), "--by", "step", "--step-range", "AllToAll4D", "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) > 60  # a row per step and rank
    csv = tmp_path / "t.csv"
    run = subprocess.run([*CLI, "analyze", str(out), "--csv", str(csv), "-q"], capture_output=True, text=True)
    assert run.returncode == 0 and csv.read_text().count("\n") == 3, run.stderr


def test_cli_export_plot_report_compare_read_exports(tmp_path):
    timeline = tmp_path / "timeline.json"
    run = subprocess.run([*CLI, "export", str(MFU), "-o", str(timeline), "--step-range", "AllToAll4D", "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    events = json.loads(timeline.read_text())["traceEvents"]
    cats = {e.get("cat") for e in events}
    assert {"kernel", "cuda_runtime", "overlapprof"} <= cats  # the step's own events beside the unions
    for command, out in (("plot", "p.png"), ("report", "r.html")):
        run = subprocess.run([*CLI, command, str(MFU), "-o", str(tmp_path / out), "-q"], capture_output=True, text=True)
        assert run.returncode == 0 and (tmp_path / out).stat().st_size > 1000, run.stderr
    run = subprocess.run([*CLI, "compare", str(MFU), str(H100), "--json", str(tmp_path / "c.json"), "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    saved = json.loads((tmp_path / "c.json").read_text())
    assert len(saved["variants"]) == 2


# ---- bad input: one line each, exit non-zero, nothing written --------------------------------------

def test_whatif_and_advise_replay_an_exports_steps_named_by_step_range():
    """The replay reads an export as analyze does: without a step range, one line that names
    --step-range; with it, the unchanged replay gives the traced steps back and advise answers."""
    run = subprocess.run([*CLI, "whatif", str(MFU), "--set", "compute=x0.5", "-q"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--step-range NAME" in run.stderr, run.stderr
    run = subprocess.run([*CLI, "whatif", str(MFU), "--step-range", "AllToAll4D", "--set", "compute=x0.5",
                          "--set", "bandwidth=x2", "--json", "-", "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert [r["rank"] for r in result["ranks"]] == [0, 1] and abs(result["replay_error"]) < 0.05
    steps = analyze(MFU, workers=1, step_range="AllToAll4D").ranks[0].steps
    assert len(steps) > 30  # the AllToAll4D ranges, not the whole capture
    faster = next(p for p in result["predictions"] if p["change"] == "compute=x0.5")
    assert faster["step_us"] < result["replayed_step_us"]  # modelled: a step, no reason
    run = subprocess.run([*CLI, "advise", str(MFU), "--step-range", "AllToAll4D", "--json", "-", "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["traced_step_us"] == pytest.approx(result["traced_step_us"])


def _refused(tmp_path, path, *words, extra=()):
    out = tmp_path / "never.json"
    run = subprocess.run([*CLI, "analyze", str(path), "--json", str(out), *extra], capture_output=True, text=True)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr
    assert "Traceback" not in run.stderr and not out.exists()
    for w in words:
        assert w in lines[0], lines[0]


def test_an_nsys_report_is_refused_with_the_export_command(tmp_path):
    rep = tmp_path / "job.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    _refused(tmp_path, rep, f"nsys export --type sqlite --output {tmp_path / 'job.sqlite'} {rep}")


def test_a_report_is_exported_first_when_nsys_is_on_path(tmp_path):
    """A stand-in `nsys` (this machine has none) that writes the export the way `nsys export`
    does: to --output, from the report given last."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nsys").write_text(f"#!/bin/sh\n[ \"$1 $2 $3 $4\" = 'export --type sqlite --output' ] || exit 3\n"
                                f"cp {MFU} \"$5\" && chmod 644 \"$5\"\n")
    (tools / "nsys").chmod(0o755)
    rep = tmp_path / "job.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    run = subprocess.run([*CLI, "analyze", str(rep), "--json", "-"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert [r["files"][0] for r in report["ranks"]] == [f"{tmp_path / 'job.sqlite'}#pid=144",
                                                        f"{tmp_path / 'job.sqlite'}#pid=145"]
    assert any("exported to" in w for w in report["warnings"]) and (tmp_path / "job.sqlite").is_file()
    # the export beside it is taken as it is, nsys or not
    run = subprocess.run([*CLI, "analyze", str(rep), "--json", "-"], capture_output=True, text=True)
    assert run.returncode == 0 and any("analyzed its export" in w for w in json.loads(run.stdout)["warnings"])
    # nsys failing: one line, with the command
    (tmp_path / "job.sqlite").unlink()
    (tools / "nsys").write_text("#!/bin/sh\necho 'cannot open report' >&2\nexit 1\n")
    run = subprocess.run([*CLI, "analyze", str(rep)], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "failed (cannot open report)" in run.stderr


def test_a_sqlite_file_that_is_not_an_export(tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("create table t (x)")
    con.commit()
    con.close()
    _refused(tmp_path, path, "not an Nsight Systems export")


def _copy(tmp_path, name="copy.sqlite"):
    path = tmp_path / name
    shutil.copy(H100, path)
    path.chmod(0o644)
    return path


def test_an_export_without_gpu_activity(tmp_path):
    path = _copy(tmp_path)
    con = sqlite3.connect(path)
    for t in ("KERNEL", "MEMCPY", "MEMSET"):
        con.execute(f"delete from CUPTI_ACTIVITY_KIND_{t}")
    con.commit()
    con.close()
    _refused(tmp_path, path, "no GPU activity")


def test_a_truncated_export(tmp_path):
    path = tmp_path / "cut.sqlite"
    path.write_bytes(H100.read_bytes()[: 200_000])
    _refused(tmp_path, path, "truncated or damaged")


def test_a_locked_export(tmp_path):
    path = _copy(tmp_path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("begin exclusive")
    try:
        _refused(tmp_path, path, "locked")
    finally:
        holder.execute("rollback")
        holder.close()


def test_an_old_or_unknown_schema(tmp_path):
    path = _copy(tmp_path)
    con = sqlite3.connect(path)
    con.execute("update META_DATA_EXPORT set value = '2' where name = 'EXPORT_SCHEMA_VERSION_MAJOR'")
    con.execute("update META_DATA_EXPORT set value = '2.9.0' where name = 'EXPORT_SCHEMA_VERSION'")
    con.commit()
    con.close()
    _refused(tmp_path, path, "schema 2.9.0")
    old = _copy(tmp_path, "old.sqlite")
    con = sqlite3.connect(old)
    con.execute("drop table META_DATA_EXPORT")
    con.commit()
    con.close()
    _refused(tmp_path, old, "old schema")


def test_an_unknown_step_range_and_a_bad_rank_map(tmp_path):
    _refused(tmp_path, MFU, "no NVTX range named 'nope'", extra=("--step-range", "nope"))
    _refused(tmp_path, MFU, "--rank-map", extra=("--rank-map", "144:0"))
