"""The workload API: loading a user's own file, options, variants, the Context, the watchdog."""

import json
import threading
import time
import types

import pytest

torch = pytest.importorskip("torch", reason="the workload API runs torch (./scripts/setup.sh installs it)")
import torch.distributed as dist  # noqa: E402

from conftest import REPO, SHORT_SCHEDULE, _overlapprof  # noqa: E402
from overlapprof import workload as api  # noqa: E402
from overlapprof.errors import WorkloadError  # noqa: E402
from overlapprof.launch.watchdog import Watchdog, describe_traceback  # noqa: E402

USER_WORKLOAD = '''
"""A user's workload, outside workloads/."""
from dataclasses import dataclass

VARIANTS = {"sync": "blocking", "async": "overlapped", "odd": "own step"}
DEFAULT_VARIANT = "async"
OPTIONS = {"size": (64, "matrix side"), "lr": 0.5, "verbose": False, "mode": "fast"}

@dataclass
class State:   # dataclasses need the module registered while it is imported
    n: int

def setup(ctx):
    return State(ctx.opts.size)

def step(ctx, state):
    return "step"

def step_odd(ctx, state):
    return "odd"
'''


@pytest.fixture
def user_workload(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(USER_WORKLOAD)
    return api.load(path)


def write(tmp_path, text):
    path = tmp_path / "w.py"
    path.write_text(text)
    return path


def test_a_users_file_loads_with_variants_options_and_steps(user_workload):
    w = user_workload
    assert (w.name, list(w.variants), w.default_variant) == ("mine", ["sync", "async", "odd"],
                                                              "async")
    assert w.check_variants([]) == ["async"]
    assert w.check_variants(["odd", "sync", "odd"]) == ["odd", "sync"]
    assert w.step_function("odd")(None, None) == "odd"
    assert w.step_function("sync")(None, None) == "step"
    assert list(w.options) == ["size", "lr", "verbose", "mode", "slow_rank", "slow_ms", "slow_compute"]
    assert w.options["size"].help == "matrix side"
    text = w.describe()
    rows = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()[2:] if line.startswith("  ")}
    assert rows["async"] == "overlapped (default)" and rows["size"].split()[:2] == ["64", "matrix"]


def test_options_are_converted_from_both_forms(user_workload):
    values = user_workload.resolve_options(
        ["size=128", "mode=slow"], ["--lr", "0.25", "--verbose", "--slow-rank=1", "slow_ms=5"])
    assert values == {"size": 128, "lr": 0.25, "verbose": True, "mode": "slow", "slow_rank": 1,
                      "slow_ms": 5.0, "slow_compute": False}
    assert user_workload.resolve_options([], ["--verbose", "false"])["verbose"] is False
    assert user_workload.resolve_options()["size"] == 64


@pytest.mark.parametrize("assignments,args,message", [
    (["size=1.5"], [], "option 'size' expects an integer, got '1.5'"),
    (["lr=fast"], [], "option 'lr' expects a number, got 'fast'"),
    (["verbose=maybe"], [], "option 'verbose' expects true or false, got 'maybe'"),
    (["sizes=3"], [], "has no option 'sizes' (did you mean 'size'?)"),
    ([], ["--size"], "workload argument '--size' needs a value"),
])
def test_bad_options_are_clear_errors(user_workload, assignments, args, message):
    with pytest.raises(WorkloadError) as err:
        user_workload.resolve_options(assignments, args)
    assert message in str(err.value)


def test_unknown_variant_is_a_clear_error(user_workload):
    with pytest.raises(WorkloadError, match=r"has no variant 'asyn' \(did you mean 'async'\?\)"):
        user_workload.check_variants(["asyn"])


@pytest.mark.parametrize("text,message", [
    ("x = 1\n", "declares no VARIANTS"),
    ("VARIANTS = {'a': ''}\n", "variant 'a' has no step_a() and there is no step() function"),
    ("VARIANTS = {'a': ''}\nDEFAULT_VARIANT = 'b'\ndef step(c, s): pass\n",
     "DEFAULT_VARIANT 'b' is not in VARIANTS"),
    ("VARIANTS = {'a': ''}\nOPTIONS = {'slow_ms': 1.0}\ndef step(c, s): pass\n",
     "option 'slow_ms' is also a common option"),
    ("VARIANTS = {'a': ''}\nOPTIONS = {'sizes': [1, 2]}\ndef step(c, s): pass\n",
     "option 'sizes': default must be bool, int, float or str, not list"),
    ("import nonexistent_module_xyz\n", "ModuleNotFoundError: No module named"),
    ("import sys\nsys.exit(3)\n", "cannot load workload"),  # not a silent exit 3 of the launcher
])
def test_bad_declarations_are_clear_errors(tmp_path, text, message):
    with pytest.raises(WorkloadError) as err:
        api.load(write(tmp_path, text))
    assert message in str(err.value)


def cpu_context(**options):
    return api.Context(rank=0, world_size=1, local_rank=0, node_rank=0,
                       device=torch.device("cpu"), backend="gloo", variant="sync",
                       options={"size": 4, **options})


def test_context_phases_nest_and_metrics_group_by_step_kind():
    ctx = cpu_context()
    assert ctx.opts.size == 4 and ctx.comm_stream is None and not ctx.is_cuda
    with ctx.phase("outer"):
        with ctx.phase("inner"):
            assert ctx.current_phase == "inner"
        assert ctx.current_phase == "outer"
    assert ctx.current_phase is None
    with pytest.raises(RuntimeError), ctx.phase("failing"):
        raise RuntimeError("x")
    assert ctx.current_phase == "failing"  # what the error report names
    ctx.metric("a_ms", 1)
    ctx.step_kind = "profiled"
    ctx.metric("a_ms", 2)
    ctx.metric("a_ms", 3)
    assert ctx.metrics == {"a_ms": {"setup": [1.0], "profiled": [2.0, 3.0]}}
    with ctx.on_comm_stream():  # nothing to switch on CPU
        ctx.synchronize()


def test_phases_are_record_function_ranges_in_the_trace():
    ctx = cpu_context()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with ctx.phase("compute"):
            torch.ones(8) @ torch.ones(8)
    assert "compute" in {e.name for e in prof.events()}


def test_an_error_in_torch_distributed_names_the_call_and_the_line():
    # no process group, so torch.distributed raises from inside send()
    try:
        dist.send(torch.ones(1), dst=1)
    except Exception as exc:
        where = describe_traceback(exc.__traceback__)
    assert where.startswith("in torch.distributed.send at ")
    assert "test_workload.py:" in where
    assert where.endswith("`dist.send(torch.ones(1), dst=1)`")


def blocked_here(seconds):
    time.sleep(seconds)


def test_watchdog_names_the_line_the_main_thread_is_stuck_on():
    progress = types.SimpleNamespace(progress_at=time.monotonic())
    found = {}
    fired = threading.Event()

    def on_hang(idle_s, where):
        found.update(idle_s=idle_s, where=where)
        fired.set()

    dog = Watchdog(progress, timeout_s=0.3, on_hang=on_hang)
    dog.start()
    blocked_here(1.5)
    assert fired.wait(5)
    assert found["idle_s"] >= 0.3
    assert found["where"].startswith("at ")  # time.sleep is C: the line that called it is named
    assert found["where"].endswith("`time.sleep(seconds)`")
    assert "test_workload.py:" in found["where"]


def docs_example():
    """The complete workload in docs/writing-a-workload.md."""
    text = (REPO / "docs" / "writing-a-workload.md").read_text()
    section = text[text.index("<!-- section:workload-api -->"):
                   text.index("<!-- /section:workload-api -->")]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_example_runs_from_a_users_folder(tmp_path):
    path = tmp_path / "my_workload.py"
    path.write_text(docs_example())
    proc = _overlapprof("run", path, "--nproc", 2, "--variant", "sync", "--variant", "async",
                        "--run-id", "mine", "--out", tmp_path / "traces", "--no-analyze",
                        *SHORT_SCHEDULE, "--", "--numel", "4096")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for variant in ("sync", "async"):
        run_dir = tmp_path / "traces" / f"mine-{variant}"
        run = json.loads((run_dir / "run.json").read_text())
        assert run["status"] == "ok" and run["options"]["numel"] == 4096
        trace = json.loads((run_dir / run["traces"]["1"][0]).read_text())
        names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
        assert {"gloo:all_gather", "comm", "compute"} <= names
        assert ("wait" in names) == (variant == "async")
