"""How much a fleet costs per request against one engine: 8 replicas × 100k requests against one replica at the
same load per replica.

    python benchmarks/bench_fleet.py                      # 8 replicas, 100,000 requests, every router
    python benchmarks/bench_fleet.py --requests 20000     # a quicker look
    python benchmarks/bench_fleet.py --routers round-robin,least-requests --json

The setup is bench_sim.py's: OPT-13B on one A100-40GB with the paper's 12 GiB of KV cache
(``SimConfig.from_options(model="opt-13b", gpu="a100-40gb", available_kv_gib=12)``), ``vllm``, the ShareGPT
stand-in, Poisson arrivals. The fleet serves ``--requests`` at ``replicas × --rate``; the lone replica serves
``--requests / replicas`` at ``--rate``: the same load per replica. Both record no per-iteration log (as
bench_sim's large runs) and include ``summary()``. Times are the process's CPU time (``time.process_time``), the
best of ``--repeat`` runs, which a shared machine inflates least; building the workloads is not counted.

The issue's target: the 8-replica fleet's CPU time per request within 1.5× the lone replica's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

ROUTERS = ("round-robin", "random", "least-requests", "least-kv", "prefix", "weighted")


def _best_cpu(run, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def measure(routers, *, num_requests: int, num_replicas: int, rate: float, repeat: int) -> dict:
    from kvlab.config import SimConfig
    from kvlab.fleet import Fleet
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    config = SimConfig.from_options(model="opt-13b", gpu="a100-40gb", available_kv_gib=12)
    strategy = parse_strategy("vllm")
    per_replica = num_requests // num_replicas
    lone = load_workload("paper-sharegpt", num_requests=per_replica, rate=rate, seed=0)
    fleet_workload = load_workload("paper-sharegpt", num_requests=num_requests, rate=rate * num_replicas, seed=0)

    def lone_run():
        Simulation(strategy, config, lone, record_iterations=False).run().summary()

    lone_us = _best_cpu(lone_run, repeat) / per_replica * 1e6
    rows = []
    for router in routers:
        summary: dict = {}

        def fleet_run(router=router, summary=summary):
            summary.update(Fleet(strategy, config, fleet_workload, router, num_replicas,
                                 record_iterations=False).run().summary())

        fleet_us = _best_cpu(fleet_run, repeat) / num_requests * 1e6
        rows.append({"router": router, "cpu_us_per_request": fleet_us, "ratio": fleet_us / lone_us,
                     "load_imbalance": summary["load_imbalance"],
                     "p99_ttft_s": summary["fleet"]["ttft_s"]["p99"]})
    return {"num_replicas": num_replicas, "num_requests": num_requests, "rate_per_replica": rate,
            "lone": {"num_requests": per_replica, "cpu_us_per_request": lone_us}, "fleet": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests the fleet serves")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s per replica")
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, the best counts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.routers.split(","), num_requests=args.requests, num_replicas=args.replicas,
                     rate=args.rate, repeat=args.repeat)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    lone = result["lone"]
    print(f"one replica, {lone['num_requests']:,} requests at {args.rate:g} req/s: "
          f"{lone['cpu_us_per_request']:.1f} µs CPU per request")
    print(f"{args.replicas} replicas, {args.requests:,} requests at {args.rate * args.replicas:g} req/s:")
    print(f"  {'router':<16} {'µs/request':>10} {'× one':>6} {'imbalance':>9} {'p99 TTFT':>9}")
    for row in result["fleet"]:
        print(f"  {row['router']:<16} {row['cpu_us_per_request']:>10.1f} {row['ratio']:>6.2f} "
              f"{row['load_imbalance']:>9.3f} {row['p99_ttft_s']:>8.3f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
