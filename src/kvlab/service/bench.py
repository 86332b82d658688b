"""The bench workload: the requests `kvlab bench` sends a real server (and `--compare` simulates), `kvlab run`'s
workload bounded by default, each answer capped to the server's max_model_len as the client sends max_tokens."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvlab.config.resolve import workload_config
from kvlab.service.engine import load

if TYPE_CHECKING:
    from kvlab.workload import Workload

DEFAULT_NUM_REQUESTS = 100  # a real server's time is not free: a bounded default, unlike the simulator's 1000


def check_bench_options(workload_options: dict, gpu: str | None, sim_options: dict | None = None) -> None:
    """Refuse a bad workload option (as `kvlab run` refuses it: config.resolve.workload_config), an unknown --gpu, or
    a bad value of --compare's simulation options (``sim_options``: --cost, --block-size, ...) before the server is
    contacted, so a bad value gets its own line even when the server is down."""
    from kvlab.catalog.gpus import get_gpu

    workload_config(**workload_options)
    if gpu is not None:  # (no --gpu-memory-gib to offer: bench --compare's KV cache is the server's)
        get_gpu(gpu, otherwise=" (bench --compare takes the server's KV cache)")
    if sim_options:
        from kvlab.validate import check_options

        check_options({k: v for k, v in sim_options.items() if v is not None and k != "cost"})
        if sim_options.get("cost") is not None:
            from kvlab.cost.profiles import get_profile

            get_profile(sim_options["cost"])


def bench_workload(workload: str, rate, arrival: str, cv, num_requests: int | None, duration: float | None, seed: int,
                   max_model_len: int | None) -> Workload:
    """`kvlab run`'s workload, bounded by default to DEFAULT_NUM_REQUESTS: drawn that many times when it has no
    arrival times of its own, otherwise its first DEFAULT_NUM_REQUESTS rows (a trace's times cannot be drawn)."""
    from kvlab.workload import WORKLOADS  # (numpy: not at `kvlab size`'s start, which imports every command)

    bounded = num_requests is None and duration is None
    entry = WORKLOADS.get(workload)
    own_arrivals = (entry is None or entry.kind == "trace") and arrival in ("auto", "trace")
    if bounded and not own_arrivals:
        num_requests = DEFAULT_NUM_REQUESTS
    config = workload_config(workload=workload, rate=rate, arrival=arrival, cv=cv, num_requests=num_requests,
                             duration=duration, seed=seed)
    # A real server is sent each answer's cap (max_tokens), so the requests carry it.
    wl = load(config, max_model_len, cap_answers=max_model_len is not None)
    if bounded and wl.num_requests > DEFAULT_NUM_REQUESTS:
        wl = replace(wl, requests=wl.requests[:DEFAULT_NUM_REQUESTS],
                     description=f"{wl.description}; the first {DEFAULT_NUM_REQUESTS} (give -n or --duration for more)")
    return wl
