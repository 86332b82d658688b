#!/usr/bin/env bash
# The engine's identity tests on the engine compiled with mypyc (issue 34): the same sources built as
# `KVLAB_COMPILE=1 pip install .` builds them, into a folder of their own that shadows the editable install, then
# the golden runs, runs = stepping, the fleet's reads and the step-by-step comparison with the real vLLM engine,
# with KVLAB_EXPECT_ENGINE=compiled (a compile that fell back to pure Python fails here, it is not skipped).
#   bash scripts/test_compiled.sh [PYTHON]      # PYTHON: the test environment's interpreter (default .venv's)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
python="${1:-.venv/bin/python}"
if ! "$python" -c "import pytest" 2>/dev/null; then
  echo "test_compiled.sh: $python has no pytest: pass the test environment's interpreter (bash scripts/test.sh makes it)" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A clean copy of what the wheel is built from: an in-tree build would leave build/ and could reuse stale C.
mkdir -p "$work/src"
cp -r pyproject.toml setup.py MANIFEST.in README.md build_backend src "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
start=$SECONDS
KVLAB_COMPILE=1 "$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/wheel" "$work/src"
"$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$work/site" "$work"/wheel/*.whl
echo "compiled in $((SECONDS - start)) s"
PYTHONPATH="$work/site" KVLAB_EXPECT_ENGINE=compiled "$python" -m pytest -q -p no:cacheprovider \
  tests/test_engine.py tests/test_golden.py tests/test_runs.py tests/test_fleet_reads.py tests/test_vllm_compare.py
