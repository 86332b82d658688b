"""Derive the `paper-2023` cost profile from what the vLLM paper publishes (Kwon et al., SOSP 2023, arXiv:2309.06180).

Two published facts, two constants; the others stay the roofline's:

- §7.1: the 2023 PagedAttention kernel has 20-26% higher latency than FasterTransformer's attention. A decode
  attention kernel is bound by reading K/V, so kvlab reads K/V at the roofline's 0.8 of peak bandwidth / 1.23
  (the middle of 20-26%): attention_bandwidth_efficiency = 0.65.
- Figure 12a (OPT-13B on one A100-40GB, ShareGPT): the rate axis runs 0-2 req/s, chosen to show where each
  system's normalized latency explodes, vLLM's near its right end (1.8-2 req/s). The engine had no CUDA graphs
  and a Python scheduler; kvlab lumps that CPU time into the per-iteration overhead and picks the overhead that
  puts vLLM's capacity (requests/s served under overload, Table 1's 12 GB of KV cache) at 1.9 req/s, by
  bisection over kvlab's own simulator.

One capacity cannot separate a per-iteration overhead from a per-sequence one, so the 2023 engine's per-sequence
CPU cost is inside the per-iteration overhead here. Run:

    python scripts/derive_paper_2023.py [--write]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

TARGET_CAPACITY = 1.9  # req/s: Figure 12a's vLLM knee, 1.8-2
ATTENTION_SLOWDOWN = 1.23  # §7.1: 20-26% higher attention kernel latency
OVERLOAD_RATE = 4.0  # req/s: well above any capacity in question, so the cache and the queue are full
NUM_REQUESTS = 1500


def profile_data(overhead_s: float, capacity: float | None = None) -> dict:
    attention_bw = round(0.8 / ATTENTION_SLOWDOWN, 3)
    return {
        "name": "paper-2023", "kind": "efficiency", "model": "opt-13b", "gpu": "A100-40GB",
        "source": (
            "Derived by scripts/derive_paper_2023.py from what the vLLM paper publishes, stated as such, not "
            f"measured: attention_bandwidth_efficiency {attention_bw} = the roofline's 0.8 / {ATTENTION_SLOWDOWN} "
            "(§7.1: the 2023 attention kernel 20-26% slower than FasterTransformer's); overhead_s "
            f"{overhead_s * 1e3:.1f} ms per iteration, the value that puts kvlab's vLLM capacity on Figure 12a's "
            f"setup (OPT-13B, one A100-40GB, 12 GB of KV cache, ShareGPT) at {TARGET_CAPACITY} req/s, where the "
            "paper's 0-2 req/s axis shows vLLM's latency exploding (no CUDA graphs, a Python scheduler: the "
            "per-sequence CPU time is inside this overhead). The matmuls keep the roofline's 0.8 and 0.5."
        ),
        "constants": {"bandwidth_efficiency": 0.8, "attention_bandwidth_efficiency": attention_bw,
                      "flops_efficiency": 0.5, "attention_flops_efficiency": 0.5, "overhead_s": overhead_s,
                      "seq_overhead_s": 0.0, "prefill_token_overhead_s": 0.0, "request_latency_s": 0.0},
        "fit": {"target_capacity_rps": TARGET_CAPACITY, "capacity_rps": capacity, "overload_rate_rps": OVERLOAD_RATE,
                "num_requests": NUM_REQUESTS, "workload": "paper-sharegpt", "strategy": "vllm-paper"},
    }


def capacity(overhead_s: float) -> float:
    from kvlab.config import resolve
    from kvlab.cost.profiles import write_profile
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    with tempfile.TemporaryDirectory() as tmp:
        path = write_profile(profile_data(overhead_s), Path(tmp) / "p.json")
        config = resolve(model="opt-13b", gpu="a100-40gb", available_kv_gib=12.0, cost=str(path)).engine
    workload = load_workload("paper-sharegpt", num_requests=NUM_REQUESTS, rate=OVERLOAD_RATE, seed=0)
    return Simulation(parse_strategy("vllm-paper"), config, workload).run().summary()["throughput_rps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write src/kvlab/cost/data/paper-2023.toml")
    args = parser.parse_args()
    lo, hi = 0.0, 0.1  # seconds per iteration
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capacity(mid) > TARGET_CAPACITY else (lo, mid)
    overhead_s = round((lo + hi) / 2, 4)
    cap = capacity(overhead_s)
    print(json.dumps({"overhead_s": overhead_s, "capacity_rps": cap}))
    if args.write:
        from kvlab.cost.profiles import write_profile

        out = Path(__file__).resolve().parents[1] / "src/kvlab/cost/data/paper-2023.toml"
        print("wrote", write_profile(profile_data(overhead_s, round(cap, 3)), out))


if __name__ == "__main__":
    main()
