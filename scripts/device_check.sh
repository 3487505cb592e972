#!/usr/bin/env bash
# The CUDA check (issues 10 and 29): one command, on a machine with NVIDIA GPUs and its own python3
# with torch + CUDA + NCCL, no network. What it runs and checks: scripts/device_check.py.
#
#   scripts/device_check.sh --fetch-wheels   # here, with network: the wheels that machine lacks -> .whl/
#   scripts/device_check.sh                  # there (.whl/ carried along): verdicts, log and traces -> $OUT
#   scripts/device_check.sh --dry-run        # anywhere, no GPU (CI): the wiring
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

if [[ ${1:-} == --fetch-wheels ]]; then
  grep -v '^#' scripts/device_wheels.txt | xargs "$python" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl
  ls .whl
  exit 0
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ ${1:-} != --dry-run ]] && compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYTHONUNBUFFERED=1
exec "$python" scripts/device_check.py "$@"
