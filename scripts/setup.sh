#!/usr/bin/env bash
# Set up overlapprof on a fresh machine: a virtual environment in .venv with the pinned CPU build of
# torch and everything `overlapprof` needs. With --test, also what the test suite needs (pytest,
# hypothesis, and Debian's chromium for the HTML report's browser test).
# Idempotent: a second call installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

extra=all
[[ ${1:-} == --test ]] && extra=test

python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
# torch is pinned to the CPU build that lies on this machine's disk; an unpinned torch pulls a
# multi-GB CUDA build. On a GPU machine, install your CUDA torch first and skip this script.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[$extra]" 2>&1 \
  | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
# The project's own modules byte-compiled once: pip installs them editable, uncompiled, and where
# PYTHONDONTWRITEBYTECODE is set every process (each rank, each CLI call) would compile them again
# (about 70 ms a start for the analysis's imports, 2026-12-07).
.venv/bin/python -m compileall -q overlapprof workloads >/dev/null

if [[ $extra == test ]] && ! command -v chromium >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's chromium for the HTML report's browser test" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: chromium could not be installed; the browser test will be skipped" >&2
  else
    echo "setup: chromium not found and not root; the browser test will be skipped" >&2
  fi
fi
