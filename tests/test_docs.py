"""The docs: the site builds with `mkdocs build --strict` (no broken link or anchor, no page left
out of the nav), and the README stays a short front page whose links resolve."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_site_builds_strict(tmp_path):
    proc = _mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for page in _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]):
        html = "index.html" if page == "index.md" else f"{page[:-3]}/index.html"
        assert (tmp_path / "site" / html).is_file(), page
    assert (tmp_path / "site" / "img" / "timeline-async.png").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """What the strict build above guards against: the config turns these into errors."""
    shutil.copytree(DOCS, tmp_path / "docs", symlinks=False)
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "gpu.md"
    page.write_text(page.read_text() + "\n[a](no-such-page.md) [b](reference.md#no-such-anchor)\n")
    proc = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr and "no-such-anchor" in proc.stderr, proc.stderr[-3000:]


def test_every_docs_page_is_in_the_nav():
    nav = _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav))


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in targets)
    for target in targets:
        path = target.split("#", 1)[0]
        assert path and (REPO / path).exists(), target


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in first_block.splitlines() if line and not line.startswith("#")]
    assert commands == [
        "./scripts/setup.sh && .venv/bin/overlapprof run workloads/ring.py --nproc 4 --variant sync --variant async"
        " --link-rate 2gbit",
        "./scripts/setup.sh --test && .venv/bin/python -m pytest",
    ]
    assert (REPO / ".ci" / "run").read_text().splitlines()[-1] == commands[1]
