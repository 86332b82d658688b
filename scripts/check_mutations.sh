#!/usr/bin/env bash
# Shows that the engine's tests catch three bugs that once survived them (issue 9): each is applied to a scratch
# copy of the repository, the tests that guard runs of iterations are run there, and the script says whether
# they failed, as they must. Usage: bash scripts/check_mutations.sh [python]   (default: .venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
python="${1:-$PWD/.venv/bin/python}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

mutate() {  # NAME FILE FROM TO
  rm -rf "$scratch/repo" && mkdir -p "$scratch/repo" && cp -r src tests pyproject.toml "$scratch/repo/"
  if ! "$python" - "$scratch/repo/$2" "$3" "$4" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if old not in text:
    sys.exit(f"{path}: the code to mutate is not there any more: update scripts/check_mutations.sh")
open(path, "w").write(text.replace(old, new, 1))
PY
  then
    echo "NOT RUN   $1: its code moved"; survived=1; return
  fi
  if (cd "$scratch/repo" && PYTHONPATH=src "$python" -m pytest -q -x -p no:cacheprovider \
        tests/test_sim.py tests/test_runs.py tests/test_memory_paged.py tests/test_golden.py >"$scratch/log" 2>&1); then
    echo "SURVIVED  $1: the tests passed with this bug"; survived=1
  else
    echo "caught    $1: $(grep -E '^FAILED' "$scratch/log" | head -1)"
  fi
}

survived=0
mutate "a run's blocks handed out in reverse order" src/kvlab/memory/paged.py \
  "pool.append_new_blocks(map(tables.__getitem__, order), len(order))" \
  "pool.append_new_blocks(map(tables.__getitem__, order[::-1]), len(order))"
mutate "the log's reserved and internal-fragmentation columns swapped" src/kvlab/metrics.py \
  'for name in ("token", "reserved", "internal_fragmentation", "overhead", "free"):
            block[ITERATION_COLUMNS.index(name)] = states[name]' \
  'for name, other in zip(("token", "reserved", "internal_fragmentation", "overhead", "free"),
                               ("token", "internal_fragmentation", "reserved", "overhead", "free")):
            block[ITERATION_COLUMNS.index(name)] = states[other]'
mutate "a run's durations priced as memory-bound only (compute and attention ignored)" src/kvlab/sim.py \
  "dt = cost.iteration_times(num_seqs, 0, num_seqs, context, context)" \
  "dt = cost.iteration_times(num_seqs, 0, 0, context, 0)"
exit $survived
