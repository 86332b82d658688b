"""How many SchedulerOutputs (trips through the simulator's loop) and iterations each simulated request costs, in
the cases of count_instructions.py: what runs of iterations save, without valgrind and in seconds.

    python benchmarks/count_outputs.py                 # the seven cases, 7,200 requests each
    python benchmarks/count_outputs.py --requests 1000
    PYTHONPATH=/path/to/other/checkout/src python benchmarks/count_outputs.py   # another version's code

Each output is one of: a decode run (everyone decodes, one or more iterations), an admission beside decoders
(possibly running on as a run), or a single iteration scheduled by the scheduler's two loops.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def kind(out) -> str:
    if out.is_decode_run:
        return "decode run"
    return "admission" if out.decodes_in_bulk else "single"


def main(argv: list[str] | None = None) -> int:
    from count_instructions import CASES, setup

    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=7200, help="requests per case (default: 7,200)")
    args = parser.parse_args(argv)
    if args.requests < 1:
        print(f"error: --requests must be at least 1, got {args.requests}", file=sys.stderr)
        return 2
    print(f"{'case':>18}  {'outputs':>8}  {'iterations':>10}  per request; outputs by kind")
    for case in CASES:
        config, workload, name, record = setup(case, args.requests)
        sim = Simulation(parse_strategy(name), config, workload, record_iterations=record)
        kinds: Counter = Counter()
        while (out := sim.step()) is not None:
            kinds[kind(out)] += 1
        n = len(workload.requests)
        iterations = sim.result().integral.num_iterations
        by_kind = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(kinds.items()))
        print(f"{case:>18}  {sum(kinds.values()) / n:8.2f}  {iterations / n:10.1f}  {by_kind}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
