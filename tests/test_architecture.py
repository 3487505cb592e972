"""The package's layering (issues 11 and 28): data flows one way, the report schema imports none of ours,
the reading side never imports the launching side, rundir/ is neutral ground, and no import circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import overlapprof

PACKAGE = Path(overlapprof.__file__).parent

# The flow of data, stage by stage; a module may import its own stage or an earlier one, never a
# later one. The schema (report) and the errors are shared by all and sit outside the order.
STAGES = ["workload", "launch", "trace", "analysis", "compare", "renderers", "cli"]
SHARED = {"report", "errors", "__init__", "__main__"}
# The two sides of the run directory: the launching side writes it, the reading side reads it, and
# neither imports the other; ``rundir`` (run.json's schema, the directory, the failure records) is
# the neutral ground both import.
LAUNCHING = {"workload", "launch"}
READING = {"trace", "analysis", "compare", "report", "renderers"}
NEUTRAL = {"rundir": {"rundir", "report", "errors", "units"}}
# Both sides at once: `advise --verify` launches reruns and reads them back (issue 37); what rerun
# makes a change reads the change with the replay's own parser.
BRIDGES = {"launch/verify.py", "launch/rerun.py"}


def test_import_report_loads_no_numpy_and_nothing_of_ours_but_errors():
    code = ("import sys, overlapprof.report\n"
            "print('numpy' in sys.modules, sorted(m for m in sys.modules if m.startswith('overlapprof')))")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True)
    numpy, ours = out.stdout.split(" ", 1)
    assert numpy == "False", out.stdout
    assert {m for m in eval(ours) if not m.startswith("overlapprof.report")} == {"overlapprof", "overlapprof.errors"}
    assert "numpy" not in out.stderr  # -X importtime lists every module imported


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [m for m in found if m.startswith("overlapprof.")]


def _stage(module: str) -> str:
    return module.split(".")[1]


def test_every_module_sits_in_its_stage():
    """No module loose at the top but the package's own, the shared ones and the stages that are
    one module (issue 36: after_run, view, tensorboard, outputs and profiling moved into theirs)."""
    loose = {p.stem for p in PACKAGE.glob("*.py")} - SHARED - set(STAGES) - {"units"}
    assert not loose, loose


def test_no_import_runs_back_up_the_flow():
    backwards = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _stage("overlapprof." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        if path.relative_to(PACKAGE).as_posix() in BRIDGES:
            continue
        for module in _imports(path):
            there = _stage(module)
            if there in SHARED or there not in STAGES:
                continue
            if here == "report" or (here in STAGES and STAGES.index(there) > STAGES.index(here)):
                backwards.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not backwards, backwards


def test_the_reading_side_never_imports_the_launching_side():
    crossing = [f"{path.relative_to(PACKAGE)} imports {module}"
                for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0].removesuffix(".py") in READING
                for module in _imports(path) if _stage(module) in LAUNCHING]
    assert not crossing, crossing


def test_the_run_directory_is_neutral_ground():
    for package, allowed in NEUTRAL.items():
        for path in sorted((PACKAGE / package).glob("*.py")):
            assert {_stage(m) for m in _imports(path)} <= allowed, path


def _runtime_imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of ours that ``name`` (at ``path``) imports when it runs: at the top or inside a
    function, resolved to the module named (``from a import b``: ``a.b`` when that is a module);
    not under ``if TYPE_CHECKING``, and not its own packages (imported before it anyway)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m in modules} - ancestors - {name}


def test_no_import_circle():
    """No module of ours imports, through any chain of imports (inside functions too), one that
    imports it back."""
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: _runtime_imports(path, name, set(paths)) for name, path in paths.items()}
    circles = []
    for start in sorted(graph):  # a depth-first walk from each module, back to it
        stack, seen = [(start, [start])], set()
        while stack:
            here, chain = stack.pop()
            for there in sorted(graph[here]):
                if there == start:
                    circles.append(" -> ".join([*chain, start]))
                elif there not in seen and there > start:  # each circle once, from its least module
                    seen.add(there)
                    stack.append((there, [*chain, there]))
    assert not circles, circles


def test_report_imports_only_itself_and_errors():
    for path in sorted((PACKAGE / "report").glob("*.py")):
        assert {m.split(".")[1] for m in _imports(path)} <= {"report", "errors"}, path


def test_the_records_and_the_rank_share_the_vocabulary_not_each_other():
    """The kinds of communication live in ``analysis/vocabulary.py``: the communication records
    read them from there, never from the rank's pipeline (which imports the records)."""
    records = sorted((PACKAGE / "analysis" / "records").glob("*.py"))
    crossing = [f"{path.relative_to(PACKAGE)} imports {module}" for path in records
                for module in _imports(path) if module.startswith("overlapprof.analysis.rank")]
    assert not crossing, crossing
    assert not [m for m in _imports(PACKAGE / "analysis" / "vocabulary.py")]


# How the analysis runs (analysis/engine/: the pools, the parallel read, the store) is handed to
# what measures by the orchestration, never imported by it (issue 36).
ENGINE = "overlapprof.analysis.engine"
ORCHESTRATION = {"overlapprof.analysis.analyzer"}


def test_nothing_that_measures_imports_the_engine():
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    measuring = [n for n in paths if n.startswith("overlapprof.analysis")
                 and not n.startswith(ENGINE) and n not in ORCHESTRATION]
    assert "overlapprof.analysis.rank.read" in measuring and "overlapprof.analysis.like_hta" in measuring
    crossing = [f"{name} imports {m}" for name in sorted(measuring)
                for m in sorted(_runtime_imports(paths[name], name, set(paths))) if m.startswith(ENGINE)]
    assert not crossing, crossing
