"""The real traces of tests/data, one job each: a folder of trace files, or in tests/data/cuda
(runs recorded by ``overlapprof run --device cuda``) each run directory."""

from pathlib import Path

DATA = Path(__file__).parent / "data"


def jobs() -> list[Path]:
    found = []
    for folder in sorted(d for d in DATA.iterdir() if d.is_dir()):
        runs = sorted(p for p in folder.iterdir() if (p / "run.json").is_file())
        found += runs or [folder]
    return found


def name(path: Path) -> str:
    return str(path.relative_to(DATA))
