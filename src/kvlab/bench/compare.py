"""``kvlab bench --compare``: the measured run beside kvlab's simulation of the same requests on the server's
configuration.

    server: block_size, num_gpu_blocks (vllm:cache_config_info), max_model_len (/v1/models), the model
            (the path it loaded, or --model-config) ──▶ kvlab.config.resolve ──▶ the run service, `vllm` strategy
    requests: the ones the bench sent, each arriving at the moment it was sent (so a --concurrency run and a
              late send are simulated as the server saw them); a finished one with the output length it received
              (the server may stop early: an end-of-sequence token, its own cap), the others with the max_tokens sent

The memory side (tokens, preemptions, KV cache usage, queue lengths) follows from the block pool and the
scheduler, which kvlab models as vLLM does; the time side comes from kvlab's cost model, which matches a
server only once it is calibrated for it (``--cost``), every term of the profile included (its request latency:
the time outside the engine). Nothing here draws (see plots.py) or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.bench.client import BenchRun
from kvlab.bench.results import MetricSample
from kvlab.bench.server import ServerInfo
from kvlab.errors import KvlabError

if TYPE_CHECKING:
    from kvlab.config import KvlabConfig
    from kvlab.sim import SimResult


@dataclass(frozen=True)
class SimSetup:
    config: KvlabConfig
    strategy: str
    settings: dict  # what the simulation was given, in vLLM's names
    notes: tuple[str, ...]


def _sim_model(server: ServerInfo, model_config: str | None) -> str:
    if model_config is not None:
        return model_config
    root = server.model_root
    if root and (Path(root) / "config.json").is_file():
        return root
    return root or server.model


def sim_setup(server: ServerInfo, *, model_config: str | None = None, gpu: str = "a100-40gb",
              cost: str | None = None, block_size: int | None = None, num_gpu_blocks: int | None = None,
              max_model_len: int | None = None, max_num_seqs: int | None = None,
              max_num_batched_tokens: int | None = None) -> SimSetup:
    """The simulator's configuration for ``server``: what it publishes, overridden by what is given. Raises
    KvlabError (before any load is sent) when the KV cache's size is neither published nor given."""
    from kvlab.config.resolve import quietly

    cache = server.cache_config
    notes = [f"--{flag.replace('_', '-')} {given:,} is not the server's {cache[flag]:,} (its vllm:cache_config_info): "
             "the simulation runs another KV cache than the one measured"
             for flag, given in (("block_size", block_size), ("num_gpu_blocks", num_gpu_blocks))
             if given is not None and isinstance(cache.get(flag), int) and given != cache[flag]]  # (trial 51)
    block_size = block_size if block_size is not None else cache.get("block_size")
    num_gpu_blocks = num_gpu_blocks if num_gpu_blocks is not None else cache.get("num_gpu_blocks")
    if not isinstance(block_size, int) or not isinstance(num_gpu_blocks, int):
        raise KvlabError(f"--compare needs the server's KV cache size, and {server.shown_url} does not publish "
                         "vllm:cache_config_info: give --block-size and --num-gpu-blocks as the server was started "
                         "(its startup log says them: `kvlab vllm log`). Nothing was sent.")
    max_model_len = max_model_len if max_model_len is not None else server.max_model_len
    if max_num_seqs is None or max_num_batched_tokens is None:
        notes.append("the server does not publish max_num_seqs and max_num_batched_tokens: the simulation uses "
                     "kvlab's defaults where they are not given (--max-num-seqs, --max-num-batched-tokens)")
    options: dict[str, Any] = {"model": _sim_model(server, model_config), "gpu": gpu, "num_gpu_blocks": num_gpu_blocks,
                                "block_size": block_size, "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                                "max_num_batched_tokens": max_num_batched_tokens, "enable_chunked_prefill": True}
    if cost is not None:
        options["cost"] = cost
    else:
        notes.append(f"time side: kvlab's roofline cost model of the {gpu}, not calibrated for this server, so "
                     "latency and throughput ratios are not expected to be 1 (calibrate it and pass --cost)")
    try:
        config = quietly(options)  # (the profile's notes go into the comparison's notes)
    except KvlabError as exc:
        if model_config is not None or "model" not in str(exc):
            raise
        raise KvlabError(f"--compare cannot simulate the model {server.shown_url} serves: {exc} Or give --model-config "
                         "(the model's config.json, a Hugging Face id or a catalogue name). Nothing was sent.") from None
    strategy = "vllm" if cache.get("enable_prefix_caching") else "vllm+noprefix"
    settings = {"model": config.model.model, "gpu": config.device.label, "cost": cost, "strategy": strategy,
                "block_size": config.cache.block_size, "num_gpu_blocks": num_gpu_blocks,
                "num_slots": config.cache.num_slots, "max_model_len": config.scheduler.max_model_len,
                "max_num_seqs": config.scheduler.max_num_seqs,
                "max_num_batched_tokens": config.scheduler.max_num_batched_tokens}
    return SimSetup(config, strategy, settings, (*notes, *config.cost.model.notes))


def simulate_sent(run: BenchRun, requests, setup: SimSetup) -> SimResult:
    """kvlab's simulation of the requests that were sent, each arriving when it was sent, through the run service
    (as `kvlab run --cost PROFILE` runs it: the profile's request latency included)."""
    from kvlab import service
    from kvlab.workload import Workload

    by_id = {r.request_id: r for r in requests}
    sent = sorted((r for r in run.results if r.send_time is not None), key=lambda r: (r.send_time, r.request_id))
    if not sent:
        raise KvlabError("no request was sent: there is nothing to compare")
    # The simulator wants ids 0..N-1 in arrival order.
    replayed = tuple(replace(by_id[r.request_id], request_id=i, arrival_time=r.send_time, **_received(r))
                     for i, r in enumerate(sent))
    workload = Workload("bench", replayed, f"{len(replayed)} requests as sent by kvlab bench", "kvlab bench")
    return service.run(setup.config, [setup.strategy], workload=workload).results[0]


def _received(result) -> dict:
    """A finished request's answer as long as the one it received (like for like: the server may have stopped
    before max_tokens); the length of one that did not finish is unknown, so it keeps the max_tokens sent."""
    if result.status != "finished" or result.num_output_tokens < 1:
        return {}
    return {"output_len": result.num_output_tokens, "max_tokens": None}


def received_lengths_note(run: BenchRun) -> str | None:
    """One line when the simulation's answers are shorter than the max_tokens sent (None when none is)."""
    short = [r for r in run.results if _received(r) and r.num_output_tokens < r.requested_output_tokens]
    if not short:
        return None
    return (f"the simulation gives each finished request the output length it received: "
            f"{sum(r.num_output_tokens for r in short):,} tokens for the {len(short):,} that got fewer than asked, "
            f"not the {sum(r.requested_output_tokens for r in short):,} sent as max_tokens")


@dataclass(frozen=True)
class Series:
    time: list[float]
    value: list[float]


def measured_series(samples: list[MetricSample]) -> dict[str, Series]:
    """The scraped gauges over time, named as in simulated_series."""
    names = {"vllm:kv_cache_usage_perc": "kv_cache_usage", "vllm:num_requests_running": "num_running",
             "vllm:num_requests_waiting": "num_waiting", "vllm:num_preemptions_total": "preemptions"}
    series = {key: Series([], []) for key in names.values()}
    base: dict[str, float] = {}
    for s in samples:
        key = names.get(s.name)
        if key is None:
            continue
        value = s.value
        if key == "preemptions":  # a counter: counted from the first scrape
            value -= base.setdefault(key, value)
        series[key].time.append(s.time)
        series[key].value.append(value)
    return series


def simulated_series(result: SimResult) -> dict[str, Series]:
    """The simulation's iterations: KV cache usage as vLLM computes it (used blocks over all but the null block,
    vllm/v1/core/block_pool.py: get_usage), running and waiting, preemptions so far."""
    import numpy as np

    if result.log is None:
        raise ValueError("the simulation kept no iteration log (record_iterations=False)")
    columns = result.log.columns
    config = result.config
    usable = config.cache.num_slots - config.cache.block_size
    time = columns["time"].tolist()
    return {
        "kv_cache_usage": Series(time, (1.0 - columns["free"] / usable).tolist()),
        "num_running": Series(time, columns["num_running"].tolist()),
        "num_waiting": Series(time, columns["num_waiting"].tolist()),
        "preemptions": Series(time, np.cumsum(columns["num_preemptions"]).tolist()),
    }


def _ratio(measured, simulated) -> float | None:
    if measured is None or simulated is None:
        return None
    if simulated == 0:
        return 1.0 if measured == 0 else None
    return measured / simulated


def headline_rows(summary: dict, sim_summary: dict, measured: dict[str, Series], simulated: dict[str, Series],
                  sim_records) -> list[dict]:
    """The table: each headline figure measured, simulated and their ratio (measured / simulated)."""
    counters = summary.get("server_counters") or {}
    finished = [r for r in sim_records if r.status == "finished"]

    def peak(series: dict[str, Series], key: str):
        values = series[key].value
        return max(values) if values else None

    rows = [
        ("requests finished", summary["num_finished"], sim_summary["num_finished"]),
        # The server's counts where it publishes them, else the client's.
        ("prompt tokens", counters.get("prompt_tokens", summary["num_prompt_tokens_sent"]),
         sum(r.prompt_len for r in finished)),
        ("generation tokens", counters.get("generation_tokens", summary["num_output_tokens_received"]),
         sum(r.num_output_tokens for r in finished)),
        ("preemptions", counters.get("preemptions"), sim_summary["preemptions"]),
        ("peak KV cache usage", peak(measured, "kv_cache_usage"), peak(simulated, "kv_cache_usage")),
        ("peak running", peak(measured, "num_running"), peak(simulated, "num_running")),
        ("peak waiting", peak(measured, "num_waiting"), peak(simulated, "num_waiting")),
        ("makespan (s)", summary["makespan_s"], sim_summary["makespan_s"]),
        ("throughput (req/s)", summary["throughput_rps"], sim_summary["throughput_rps"]),
        ("throughput (tokens/s)", summary["throughput_tps"], sim_summary["throughput_tps"]),
    ]
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_latency_s", "e2e latency")):
        for stat in ("mean", "p50", "p99"):
            rows.append((f"{label} {stat} (s)", summary[key][stat], sim_summary[key][stat]))
    return [{"figure": f, "measured": m, "simulated": s, "ratio": _ratio(m, s)} for f, m, s in rows]


def latencies(bench_results, sim_records) -> dict[str, tuple[list[float], list[float]]]:
    """(measured, simulated) values of each latency of the finished requests."""
    finished = [r for r in bench_results if r.status == "finished"]
    sim_finished = [r for r in sim_records if r.status == "finished"]
    out = {}
    for attr in ("ttft", "tpot", "e2e_latency"):
        out[attr] = ([v for r in finished if (v := getattr(r, attr)) is not None],
                     [v for r in sim_finished if (v := getattr(r, attr)) is not None])
    return out
