"""The real traces of tests/data, one job each: a folder of trace files, or in tests/data/cuda
(runs recorded by ``overlapprof run --device cuda``) each run directory; with ``exports``, also
each Nsight Systems export of tests/data/nsys (two jobs: one file each; without, that folder is
left out: what reads only Kineto text, --like-hta and the memory budget, has nothing to read there)."""

from pathlib import Path

DATA = Path(__file__).parent / "data"


def jobs(exports: bool = False) -> list[Path]:
    found = []
    for folder in sorted(d for d in DATA.iterdir() if d.is_dir()):
        if folder.name == "nsys":
            found += sorted(folder.glob("*.sqlite")) if exports else []
            continue
        runs = sorted(p for p in folder.iterdir() if (p / "run.json").is_file())
        found += runs or [folder]
    return found


def name(path: Path) -> str:
    return str(path.relative_to(DATA))
