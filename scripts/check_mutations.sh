#!/usr/bin/env bash
# Shows that the engine's tests catch bugs that once survived them (issues 9 and 20): each is applied to a scratch
# copy of the repository, the tests that guard runs of iterations are run there, and the script says whether
# they failed, as they must. It fails (exit 1) when a mutation survives or its code has moved (update it here).
# The test command runs it (scripts/test.sh). Usage: bash scripts/check_mutations.sh [python]
# (default: .venv/bin/python)
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
        tests/test_sim.py tests/test_runs.py tests/test_memory_paged.py tests/test_golden.py tests/test_cost.py \
        >"$scratch/log" 2>&1); then
    echo "SURVIVED  $1: the tests passed with this bug"; survived=1
  else
    echo "caught    $1: $(grep -E '^FAILED' "$scratch/log" | head -1)"
  fi
}

survived=0
mutate "a run's blocks handed out in reverse order" src/kvlab/memory/paged.py \
  "self.block_pool.append_new_blocks(tables, len(tables))" \
  "self.block_pool.append_new_blocks(tables[::-1], len(tables))"
mutate "the log's reserved and internal-fragmentation columns swapped" src/kvlab/metrics.py \
  'for name in ("token", "reserved", "internal_fragmentation", "overhead", "free"):
            block[ITERATION_COLUMNS.index(name)] = states[name]' \
  'for name, other in zip(("token", "reserved", "internal_fragmentation", "overhead", "free"),
                               ("token", "internal_fragmentation", "reserved", "overhead", "free")):
            block[ITERATION_COLUMNS.index(name)] = states[other]'
mutate "a run's durations priced as memory-bound only where compute-bound (compute and attention ignored)" \
  src/kvlab/cost/model.py \
  "dt = overhead_s + (tokens + flops_per_pair * (num_context_tokens + i * num_seqs)) / flops" \
  "dt = fixed_s + (num_context_tokens + i * num_seqs) * kv_token_s"
mutate "the victim is the oldest running request, not the newest" src/kvlab/sched/policy.py \
  "    return len(running) - 1" \
  "    return 0"
mutate "a run ends one iteration after its first finish" src/kvlab/sched/runs.py \
  "num_iterations = min(max_iterations, (self._finish_heap()[0] >> STAMP_BITS) - self._clock)" \
  "num_iterations = min(max_iterations, (self._finish_heap()[0] >> STAMP_BITS) - self._clock + 1)"
exit $survived
