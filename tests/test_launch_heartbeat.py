"""The launcher's heartbeat line, from progress records (no ranks launched; no torch)."""

import io
import json
import time

from overlapprof.rundir import directory
from overlapprof.launch.heartbeat import Heartbeat, describe_ranks


def record(step, kind, phase, idle_s=0.0, updated=100.0, ended=None):
    return {"step": step, "step_kind": kind, "phase": phase, "idle_s": idle_s,
            "updated": updated, "ended": ended}


def test_ranks_in_the_same_place_are_grouped_and_a_stall_is_named():
    records = {0: record(3, "profiled", "comm"), 1: record(3, "profiled", "compute", idle_s=4),
               2: record(3, "profiled", "comm"), 3: record(1, "warmup", None)}
    assert describe_ranks(records, now=101.0) == (
        "ranks 0,2 ProfilerStep#3 (profiled) 'comm'; rank 1 ProfilerStep#3 (profiled) "
        "'compute', no progress for 5 s; rank 3 warm-up step 1")
    records = {0: record(None, "setup", "setup"), 1: record(0, "warmup", "comm", ended="ok")}
    assert describe_ranks(records, now=100.0) == "rank 0 starting 'setup'; rank 1 done"


def test_heartbeat_prints_plain_lines_into_a_file(tmp_path):
    (tmp_path / "progress").mkdir()
    for rank in (0, 1):
        directory.write_progress(directory.progress_file(tmp_path, rank),
                                 record(2, "unprofiled", "compute", updated=time.time()))
    stream = io.StringIO()
    beat = Heartbeat(tmp_path, [0, 1], stream, plain_interval_s=0.05).start()
    time.sleep(0.5)
    beat.stop()
    lines = stream.getvalue().splitlines()
    assert lines and all(line.startswith("overlapprof: ") for line in lines)
    assert lines[0].endswith(" s: ranks 0-1 ProfilerStep#2 (unprofiled) 'compute'")
    assert "\r" not in stream.getvalue()
    assert json.loads(directory.progress_file(tmp_path, 0).read_text())["step"] == 2
