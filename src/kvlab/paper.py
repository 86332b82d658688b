"""The vLLM paper's experiments, rebuilt from first principles (W. Kwon et al., SOSP 2023, arXiv:2309.06180).

Figure 2: the share of KV cache memory holding token states, reservations, internal fragmentation and
external fragmentation & other, time-averaged over the §6.2 experiment: OPT-13B on one A100-40GB with
Table 1's 12 GB of KV cache (15.7K slots), ShareGPT requests with Poisson arrivals, through Orca (Max),
Orca (Pow2), Orca (Oracle) and vLLM.

The paper's shares describe systems whose KV cache was the binding constraint: a full cache and a queue.
So the experiment is run at a rate above what the fastest of the four can serve; ``saturation`` reports the
share of time each system had requests waiting, so that a reader can check the premise held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvlab.metrics import SHARE_KEYS

# Figure 2 of the paper (percent of KV memory). Orca (Oracle) has no internal fragmentation ("–");
# vLLM's bar gives only the token share (96.3%); the rest is split in no published figure.
FIG2_PAPER: dict[str, dict[str, float | None]] = {
    "orca-max": {"token": 20.4, "reserved": 13.3, "internal_fragmentation": 57.3, "external_fragmentation": 8.9},
    "orca-pow2": {"token": 26.8, "reserved": 17.9, "internal_fragmentation": 13.6, "external_fragmentation": 41.6},
    "orca-oracle": {"token": 38.2, "reserved": 25.2, "internal_fragmentation": 0.0, "external_fragmentation": 36.6},
    "vllm": {"token": 96.3, "reserved": None, "internal_fragmentation": None, "external_fragmentation": None},
}
FIG2_SYSTEMS = tuple(FIG2_PAPER)
PAPER_NAMES = {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)", "vllm": "vLLM"}


@dataclass(frozen=True, slots=True)
class Fig2Setup:
    model: str = "opt-13b"
    gpu: str = "a100-40gb"
    available_kv_gib: float = 12.0  # Table 1: 12 GB of KV cache for OPT-13B on one A100 (15,728 slots)
    workload: str = "paper-sharegpt"
    # The paper-era clock (kvlab cost: paper-2023, derived from Figure 12a and §7.1), and the right end of Figure 12a's
    # rate axis for this setup: above the ~1.9 req/s that clock lets vLLM serve, so every cache fills.
    rate: float = 2.0
    cost: str = "paper-2023"
    num_requests: int = 2000
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Fig2Row:
    system: str
    shares: dict[str, float]  # kvlab's, percent, summing to 100
    paper: dict[str, float | None]
    saturation: float  # share of busy time with requests waiting
    throughput_rps: float
    mean_batch_size: float
    mean_iteration_s: float
    preemptions: int


def run_fig2(setup: Fig2Setup = Fig2Setup(), progress: Callable[[str, int, int], None] | None = None) -> list[Fig2Row]:
    from kvlab.sim import SimConfig, Simulation
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    config = SimConfig.from_options(model=setup.model, gpu=setup.gpu, available_kv_gib=setup.available_kv_gib,
                                    cost=setup.cost)
    workload = load_workload(setup.workload, num_requests=setup.num_requests, rate=setup.rate, seed=setup.seed)
    rows = []
    for system in FIG2_SYSTEMS:
        sim = Simulation(parse_strategy(system), config, workload)
        callback = None if progress is None else (lambda done, total, s=system: progress(s, done, total))
        result = sim.run(progress=callback)
        summary = result.summary()
        rows.append(
            Fig2Row(
                system=system,
                shares=summary["memory_shares"],
                paper=FIG2_PAPER[system],
                saturation=_saturation(result),
                throughput_rps=summary["throughput_rps"],
                mean_batch_size=summary["mean_batch_size"],
                mean_iteration_s=result.integral.busy_time / max(1, result.integral.num_iterations),
                preemptions=summary["preemptions"],
            )
        )
    return rows


def _saturation(result) -> float:
    """Share of busy time with requests waiting: Σ dt over iterations with a queue / Σ dt."""
    cols = result.log.columns
    busy = float(cols["duration"].sum())
    return float(cols["duration"][cols["num_waiting"] > 0].sum()) / busy if busy else 0.0


def fig2_json(setup: Fig2Setup, rows: list[Fig2Row]) -> dict:
    return {
        "setup": {
            "model": setup.model, "gpu": setup.gpu, "available_kv_gib": setup.available_kv_gib,
            "workload": setup.workload, "rate": setup.rate, "num_requests": setup.num_requests, "seed": setup.seed,
            "cost": setup.cost,
        },
        "systems": {
            row.system: {
                **{key: row.shares[key] for key in SHARE_KEYS},
                "paper": row.paper,
                "saturation": row.saturation,
                "throughput_rps": row.throughput_rps,
                "mean_batch_size": row.mean_batch_size,
                "mean_iteration_s": row.mean_iteration_s,
                "preemptions": row.preemptions,
            }
            for row in rows
        },
    }
