"""overlapprof/trace/nsys.py: what an Nsight Systems export is, its ranks and their names, and
the rows read from it, on the real exports of tests/data/nsys and copies altered by SQL."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from overlapprof.analysis.rank.nsys_scan import _glob_literal, runtime_name
from overlapprof.errors import TraceError
from overlapprof.trace import nsys as N
from overlapprof.trace.discover import is_trace_file, rank_from_name

DATA = Path(__file__).parent / "data" / "nsys"
MFU = DATA / "mfu_2gpu_before.sqlite"


def test_the_ranks_of_an_export_are_its_gpu_processes_by_device():
    assert N.ranks_of(MFU) == [f"{MFU}#pid=144", f"{MFU}#pid=145"]
    with N.open_export(MFU) as ex:
        procs = N.gpu_processes(ex)
        assert [(pid, dev) for _, pid, dev in procs] == [(144, 0), (145, 1)]
        assert ex.version == "3.25.0" and N.global_pid(ex, 145) == procs[1][0]
        with pytest.raises(TraceError, match="no process 999"):
            N.global_pid(ex, 999)


def test_member_names_split_and_carry_no_rank_of_their_own():
    name = N.member("/x/rank3.sqlite", 145)
    assert N.split(name) == ("/x/rank3.sqlite", 145) and N.split("/x/rank3.sqlite") == ("/x/rank3.sqlite", None)
    assert rank_from_name(Path(name).name) is None and rank_from_name("rank3.sqlite") == 3


def test_rows_are_ordered_by_start_and_complete(tmp_path):
    with N.open_export(MFU) as ex:
        gp = N.global_pid(ex, 144)
        act, rt, sy = N.activity(ex, gp), N.runtime(ex, gp), N.syncs(ex, gp)
        counts = [ex.query(f"select count(*) from {t} where globalPid = ?", (gp,))[0][0] for t in N.ACTIVITY]
    assert act["start"].size == sum(counts) and (act["start"][1:] >= act["start"][:-1]).all()
    assert (rt["start"][1:] >= rt["start"][:-1]).all() and set(rt["tid"].tolist()) == {144, 245}
    kernels = act["table"] == 0
    assert set((act["lane"][kernels] >> 32).tolist()) == {0} and set((act["lane"][kernels] & 0xFFFFFFFF).tolist()) == {7}
    assert sy["start"].size > 0 and set(sy["type"].tolist()) <= set(N.SYNC_NAMES)


def test_names_as_kineto_writes_them():
    assert runtime_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert N.clean_name("c10d::alltoall_base_, op_id = 991142") == "c10d::alltoall_base_"
    assert N.clean_name("aten::mm, seq = 5, op_id = 6, sizes = [[2, 3]]") == "aten::mm"
    assert N.clean_name("my, own range") == "my, own range"
    assert _glob_literal("a*b[c]?") == "a[*]b[[]c][?]"


def test_a_report_names_the_command_that_exports_it():
    assert N.is_report("run.nsys-rep") and N.is_report("old.qdrep") and not N.is_report("x.sqlite")
    assert N.export_command("/p/run.nsys-rep") == "nsys export --type sqlite --output /p/run.sqlite /p/run.nsys-rep"


def test_a_schema_without_a_column_read_is_refused_by_name(tmp_path):
    path = tmp_path / "old.sqlite"
    shutil.copy(MFU, path)
    path.chmod(0o644)
    con = sqlite3.connect(path)
    con.execute("alter table CUPTI_ACTIVITY_KIND_KERNEL drop column demangledName")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match="CUPTI_ACTIVITY_KIND_KERNEL has no column 'demangledName'"):
        N.open_export(path)


def test_an_export_is_never_overwritten_by_an_output(tmp_path):
    path = tmp_path / "job.sqlite"
    shutil.copy(MFU, path)
    path.chmod(0o644)
    before = path.read_bytes()
    assert is_trace_file(path)
    run = subprocess.run([sys.executable, "-m", "overlapprof", "analyze", str(path), "--json", str(path), "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("Error: ") and path.read_bytes() == before
