"""How fast a run of a hybrid model goes (several KV cache groups: kvlab.memory.hybrid), its decode runs planned
only at their block events (``HybridAllocator.allocate_decode_run``) against one iteration at a time
(``allocate_decode_run_stepwise``, the definition it is tested against).

    python benchmarks/hybrid_run.py                  # gemma-4-e2b-it (4 sliding + 1 full group), 200 requests
    python benchmarks/hybrid_run.py --model tests/data/sizing_configs/qwen3.6-27b.json --requests 500
    python benchmarks/hybrid_run.py --json
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/hybrid_run.py --model M --untimed 1

The run is ``kvlab run vllm --model MODEL --gpu h100-sxm --workload sharegpt-8k -n N --cost vllm-h100``, in this
process: the configuration and the workload are built before the clock starts; each mode keeps the best wall time of
``--repeat`` runs (CPU time beside it: a shared machine inflates it less). A separate untimed run of each mode counts
``HybridAllocator._plan`` calls. Both modes must end with the same summary (the script says so, and exits 1 if not).
Needs the sharegpt-8k trace (KVLAB_TRACES_DIR or ``kvlab workloads fetch sharegpt-8k``). ``--untimed N`` builds the
same and runs ``--strategy`` (default ``vllm``) N times, events mode, nothing timed or printed: under valgrind's
callgrind, ``--untimed 1`` less ``--untimed 0`` is one run's machine instructions (a figure a shared machine's load does
not move).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def build(model: str, num_requests: int):
    from kvlab.config import resolve
    from kvlab.service.engine import load

    config = resolve(model=model, gpu="h100-sxm", workload="sharegpt-8k", num_requests=num_requests, cost="vllm-h100")
    return config, load(config)


def run_once(config, workload) -> dict:
    from kvlab.service.engine import run

    result = run(config, ["vllm"], workload=workload).results[0]
    return result.summary()


def run_untimed(config, workload, strategy: str, times: int) -> None:
    from kvlab.service.engine import run

    for _ in range(times):
        run(config, [strategy], workload=workload)


def timed(config, workload, repeat: int) -> tuple[float, float, dict]:
    best_wall, best_cpu, summary = float("inf"), float("inf"), {}
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        summary = run_once(config, workload)
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return best_wall, best_cpu, summary


def count_plans(config, workload) -> int:
    from kvlab.memory.hybrid import HybridAllocator

    plan, calls = HybridAllocator._plan, [0]

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return plan(self, *args, **kwargs)

    HybridAllocator._plan = counting  # type: ignore[method-assign]
    try:
        run_once(config, workload)
    finally:
        HybridAllocator._plan = plan  # type: ignore[method-assign]
    return calls[0]


def measure(config, workload, mode: str, repeat: int) -> dict:
    from kvlab.memory.hybrid import HybridAllocator

    fast = HybridAllocator.allocate_decode_run
    if mode == "stepwise":
        HybridAllocator.allocate_decode_run = HybridAllocator.allocate_decode_run_stepwise  # type: ignore[method-assign]
    try:
        wall, cpu, summary = timed(config, workload, repeat)
        plans = count_plans(config, workload)
    finally:
        HybridAllocator.allocate_decode_run = fast  # type: ignore[method-assign]
    return {"mode": mode, "wall_s": wall, "cpu_s": cpu, "requests_per_s": workload.num_requests / wall,
            "plan_calls": plans, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tests/data/sizing_configs/gemma-4-e2b-it.json")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--untimed", type=int, metavar="N", help="only run --strategy N times, untimed (for callgrind)")
    parser.add_argument("--strategy", default="vllm", help="the strategy --untimed runs (default vllm)")
    args = parser.parse_args(argv)
    from kvlab.errors import KvlabError

    try:
        config, workload = build(args.model, args.requests)
    except KvlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.untimed is not None:
        try:
            run_untimed(config, workload, args.strategy, args.untimed)
        except KvlabError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    rows = [measure(config, workload, mode, args.repeat) for mode in ("events", "stepwise")]
    same = rows[0]["summary"] == rows[1]["summary"]
    if args.json:
        print(json.dumps({"model": args.model, "num_requests": args.requests, "same_summary": same,
                          "load_average": os.getloadavg()[0],
                          "runs": [{k: v for k, v in r.items() if k != "summary"} for r in rows]}, indent=2))
    else:
        print(f"{args.model}, vllm, sharegpt-8k, {args.requests} requests, h100-sxm, vllm-h100 "
              f"(best of {args.repeat}; load average {os.getloadavg()[0]:.1f})")
        for r in rows:
            print(f"  {r['mode']:<9} {r['wall_s']:7.2f} s wall {r['cpu_s']:7.2f} s cpu {r['requests_per_s']:8.1f} req/s "
                  f"{r['plan_calls']:>10,} _plan calls")
        print(f"  stepwise / events: {rows[1]['wall_s'] / rows[0]['wall_s']:.1f}x wall, "
              f"{rows[1]['cpu_s'] / rows[0]['cpu_s']:.1f}x cpu; same summary: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
