"""Machine instructions per simulated request, counted by valgrind's callgrind: a figure that, unlike time, does not
drift with a shared machine's load (two runs of the same code agree to within a fraction of a percent).

    python benchmarks/count_instructions.py                      # the seven cases below, 7,200 requests each
    python benchmarks/count_instructions.py --case 1.5 --requests 10000
    PYTHONPATH=/path/to/other/checkout/src python benchmarks/count_instructions.py   # another version's code
    PYTHONPATH=/path/to/compiled/site python benchmarks/count_instructions.py --case vllm --requests 3000 --run-only

Cases: each strategy of the lesson's race on bench_sim.py's setup (OPT-13B, 12 GiB of KV cache, paper-sharegpt at
2 req/s, log on), ``vllm`` on it with the log off (bench_sim.py's million-request run), or a rate of the
saturation benchmark (``vllm`` on Llama-2-7B, 7,424 blocks, ShareGPT clipped to 4,096, chunked prefill off:
1.5 req/s is below capacity, 2.1 above). Each case runs twice under callgrind, with and without the simulation
(same imports, same workload built, the same small warm-up run), and the difference is divided by the number of
requests. Needs valgrind (``apt install valgrind``); about two minutes per case here.

``--run-only`` counts ``Simulation.run`` alone, once per case (callgrind's ``--toggle-collect`` on the compiled
run's entry point, as issue 34's steps counted it by hand in benchmarks/README.md): the compiled engine only, whose
build a ``PYTHONPATH`` folder names (made as scripts/test_compiled.sh makes it); on the pure engine there is no
such function and the script says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

# The lesson's four, bench_sim.py's large run (vllm, log off) and the saturation benchmark's two rates.
CASES = ("static+max", "continuous+max", "static+paged", "continuous+paged", "vllm", "1.5", "2.1")

def setup(case: str, num_requests: int):
    """A case's (config, workload, strategy name, whether the iteration log is kept)."""
    from bench_sim import clipped, engine_config  # (benchmarks/ is on sys.path: this file's folder)

    from kvlab.workload import load_workload

    if case[0].isdigit():
        config = engine_config(model="llama-2-7b", gpu="a100-80gb", num_gpu_blocks=7425, max_model_len=4096,
                               max_num_batched_tokens=4096, enable_chunked_prefill=False)
        workload = clipped(load_workload("sharegpt-8k", num_requests=num_requests, rate=float(case),
                                         arrival="poisson", seed=0), 4096)
        return config, workload, "vllm", False
    config = engine_config(model="opt-13b", gpu="a100-40gb", available_kv_gib=12)
    return config, load_workload("paper-sharegpt", num_requests=num_requests, rate=2.0, seed=0), case, case != "vllm"


CHILD = r"""
import sys
sys.path.insert(0, {benchmarks!r})
from count_instructions import setup
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import load_workload

case, num_requests, simulate = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
config, workload, name, record = setup(case, num_requests)
warm = load_workload("paper-sharegpt", num_requests=20, rate=2.0, seed=1)  # lazy imports, paid in both runs
Simulation(parse_strategy(name), config, warm, record_iterations=record).run().summary()
if simulate:
    Simulation(parse_strategy(name), config, workload, record_iterations=record).run().summary()
"""


# The compiled engine's Simulation.run as the C symbol mypyc gives it (its Python-callable wrapper).
RUN_SYMBOL = "CPyPy_sim___Simulation___run"


def count(case: str, num_requests: int, simulate: bool, run_only: bool = False) -> int:
    child = CHILD.format(benchmarks=os.path.dirname(os.path.abspath(__file__)))
    only = [f"--toggle-collect={RUN_SYMBOL}"] if run_only else []
    run = subprocess.run(["valgrind", "--tool=callgrind", *only, "--callgrind-out-file=/dev/null", sys.executable,
                          "-c", child, case, str(num_requests), "1" if simulate else "0"],
                         capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{run.stderr[-2000:]}")
    if run_only and int(found.group(1)) == 0:
        raise SystemExit(f"error: --run-only counted nothing: no {RUN_SYMBOL} ran, so this is the pure-Python engine "
                         "(PYTHONPATH a compiled build's folder, made as scripts/test_compiled.sh makes it)")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=CASES, help="a case (repeatable; default: all seven)")
    parser.add_argument("--requests", type=int, default=7200, help="requests per case (default: 7,200)")
    parser.add_argument("--run-only", action="store_true",
                        help="count Simulation.run alone, once (the compiled engine only)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("error: valgrind is not installed (apt install valgrind)", file=sys.stderr)
        return 2
    if args.requests < 1:
        print(f"error: --requests must be at least 1, got {args.requests}", file=sys.stderr)
        return 2
    rows = {}
    for case in args.case or CASES:
        if args.run_only:
            per_request = count(case, args.requests, True, run_only=True) / args.requests
        else:
            per_request = (count(case, args.requests, True) - count(case, args.requests, False)) / args.requests
        rows[case] = per_request
        print(f"{case:>18}: {per_request / 1e3:8.0f}k instructions per request ({args.requests:,} requests)", flush=True)
    if "1.5" in rows and "2.1" in rows:
        print(f"{'saturated / light':>18}: {rows['2.1'] / rows['1.5']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
