"""Capacity: the highest request rate each configuration sustains under a latency target (`kvlab capacity`).

    the grid's points without a rate ──▶ searched_configurations: each cost profile that applies to the GPU (without
        --cost), the workload scaled to load the engine (twice its seats in the measured window, without -n or
        --duration), a window too short to measure refused
    ──▶ capacities(configurations, runner, slo, ...): kvlab.sweep.capacity's searches (bracket, then bisect), every
        rate tried a sweep point stored in the runner's store (a search run again, or resumed after Ctrl-C, reads
        them), judged on its measured window (kvlab.window) against the SLO (kvlab.sweep.slo)
    ──▶ Answer: the searches with what they were searched on, their spread over cost profiles; capacity_json
"""

from __future__ import annotations

import json
import math
from typing import Any

import kvlab
from kvlab.catalog import get_gpu
from kvlab.config.options import DEFAULT_NUM_REQUESTS
from kvlab.cost.profiles import applicable_profiles
from kvlab.errors import KvlabError
from kvlab.service.engine import load, strategies
from kvlab.sweep.capacity import Search, search_capacities
from kvlab.sweep.grid import expand
from kvlab.sweep.point import resolve_point, varied_options
from kvlab.window import DRAIN_SHARE, WARMUP_SHARE, mean_tokens_held, num_seats

TYPICAL_SEARCH_RUNS = 8  # simulations a search usually takes (bracket + bisection to 5%): for the time estimate
SEATS_FACTOR = 2  # the default workload: this many times the engine's seats arrive in the measured window
MIN_WINDOW_REQUESTS = 10  # fewer in the measured window measure nothing


def window_num_requests(seats: int) -> int:
    """Requests enough that SEATS_FACTOR × ``seats`` arrive in the measured window (kvlab.window: its middle 70%),
    in hundreds, at least `kvlab run`'s default."""
    needed = SEATS_FACTOR * seats / (1 - WARMUP_SHARE - DRAIN_SHARE)
    return max(DEFAULT_NUM_REQUESTS, 100 * math.ceil(needed / 100))


def seats_of(point: dict[str, Any], varied: set[str] | None = None) -> int:
    """The seats of a point's engine (kvlab.window.num_seats) on its workload (an error names the point by its
    ``varied`` options, kvlab.sweep.point.resolve_point)."""
    resolved = resolve_point(point, kvlab.__version__, varied)
    config = resolved.config
    allocator = strategies([resolved.strategy], config)[0].allocator
    held = mean_tokens_held(allocator, load(config).requests, config.scheduler.max_model_len)
    return num_seats(config.scheduler.max_num_seqs, config.cache.num_slots, held) * config.parallel.data_parallel_size


def _given(name: str, lists: dict, explicit: list[dict]) -> bool:
    return name in lists or any(name in p for p in explicit)


def searched_configurations(lists: dict, explicit: list[dict], start_rate: float):
    """The configurations to search (the grid's points without a rate), each cost profile that applies to the GPU
    when --cost is not given, and the workload scaled to each one's seats when neither -n nor --duration is; with
    their seats and whether they were scaled. A window too short to measure at the first rate is refused."""
    configurations = expand(lists, explicit)
    varied = varied_options(configurations)  # (in an error: what the user varies, not the profiles added below)
    if not _given("cost", lists, explicit):  # the clock's uncertainty: every profile that applies to the GPU

        configurations = [{**c, "cost": name} for c in configurations
                          for name in applicable_profiles(get_gpu(c["gpu"]).id)]
    scaled = not (_given("num_requests", lists, explicit) or _given("duration", lists, explicit))
    seats = [seats_of({**c, "rate": start_rate}, varied) for c in configurations]
    if scaled:
        configurations = [{**c, "num_requests": window_num_requests(s)} for c, s in zip(configurations, seats)]
    _check_window(configurations, start_rate)
    return configurations, seats, scaled


def _check_window(configurations: list[dict], start_rate: float) -> None:
    """A workload whose measured window would hold fewer than MIN_WINDOW_REQUESTS at the first rate measures
    nothing: refused, naming what would do."""
    share = 1 - WARMUP_SHARE - DRAIN_SHARE
    for c in configurations:
        if c.get("duration") is not None:
            expected = c["duration"] * start_rate * share
            if expected < MIN_WINDOW_REQUESTS:
                need = MIN_WINDOW_REQUESTS / share / start_rate
                raise KvlabError(f"--duration {c['duration']:g}: at the first rate ({start_rate:g} req/s) the measured "
                                 f"window (the middle {share:.0%} of the arrivals) would hold about "
                                 f"{_requests(expected)}; valid: --duration {math.ceil(need)} or more (or a higher "
                                 "--rate)")
        elif c.get("num_requests") is not None and c["num_requests"] * share < MIN_WINDOW_REQUESTS:
            need = math.ceil(MIN_WINDOW_REQUESTS / share)
            raise KvlabError(f"--num-requests {c['num_requests']}: the measured window (the middle {share:.0%} of the "
                             f"arrivals) would hold about {_requests(c['num_requests'] * share)}; valid: -n {need} "
                             "or more")


def _requests(count: float) -> str:
    return f"{count:.0f} request{'' if round(count) == 1 else 's'}"


def capacities(configurations: list[dict], runner, slo, start_rates: list[float], rtol: float,
               max_rate: float) -> tuple[list[Search], list[dict[str, Any]]]:
    """The searches (kvlab.sweep.capacity: bracket, then bisect) on ``runner`` (its store keeps every rate tried: a
    search run again reads them), and the stored rows of every rate they tried (for the curves)."""
    searches = search_capacities(configurations, runner, slo, start_rates=start_rates, rtol=rtol, max_rate=max_rate)
    keys = [resolve_point({**c, "rate": r}, kvlab.__version__).key
            for c, s in zip(configurations, searches) for r, _, _ in s.probes]
    return searches, runner.store.rows(keys)


class Answer:
    """The searches with what they were searched on: a report's material."""
    SETUP_FIELDS = ("model", "gpu", "num_gpus", "tensor_parallel_size", "pipeline_parallel_size", "replicas",
                    "num_gpu_blocks", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                    "enable_chunked_prefill", "cost")

    def __init__(self, configurations, searches, setups, seats, slo, scaled: bool):
        self.configurations, self.searches, self.setups, self.seats = configurations, searches, setups, seats
        self.slo, self.scaled = slo, scaled

    def costs(self) -> list[str]:
        return list(dict.fromkeys(s["cost"] for s in self.setups))

    def setup_of(self, i: int) -> dict[str, Any]:
        """Configuration ``i``'s setup: kvlab.config's description, with the workload's length and seats."""
        setup = dict(self.setups[i])
        workload = dict(setup.pop("workload"))
        workload.pop("rate", None)  # searched
        return {**setup, "workload": {**workload, "arrival_rate": "searched", "num_seats": self.seats[i],
                                      "scaled_to_seats": self.scaled}}

    def common_setup(self) -> dict[str, Any]:
        """What every configuration shares (fields that vary are in each capacity's entry)."""
        all_setups = [self.setup_of(i) for i in range(len(self.setups))]
        common = {k: v for k, v in all_setups[0].items() if k != "workload" and all(s.get(k) == v for s in all_setups)}
        workloads = [s["workload"] for s in all_setups]
        common["workload"] = {k: v for k, v in workloads[0].items() if all(w.get(k) == v for w in workloads)}
        return common

    def spreads(self) -> list[dict[str, Any]]:
        """For each configuration but its cost profile: the capacity under each profile, and their spread."""
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(self.configurations):
            groups.setdefault(json.dumps({k: v for k, v in c.items() if k not in ("cost", "num_requests")},
                                         sort_keys=True, default=str), []).append(i)
        spreads = []
        for indices in groups.values():
            if len(indices) < 2:
                continue
            by_cost = {self.setups[i]["cost"]: self.searches[i].capacity for i in indices}
            values = [v for v in by_cost.values() if v > 0]
            spreads.append({"strategy": self.configurations[indices[0]]["strategy"], "capacities": by_cost,
                            "low": min(values, default=0.0), "high": max(values, default=0.0),
                            "spread": (max(values) / min(values) - 1) if values else None})
        return spreads


def capacity_json(answer: Answer, option_names) -> list[dict]:
    common = answer.common_setup()
    entries = []
    for i, (c, s) in enumerate(zip(answer.configurations, answer.searches)):
        setup = answer.setup_of(i)
        own = {k: v for k, v in setup.items() if k != "workload" and common.get(k) != v}
        own_workload = {k: v for k, v in setup["workload"].items() if common["workload"].get(k) != v}
        entries.append({**{n: c[n] for n in option_names if n != "rate"}, **s.to_json(), "setup": setup,
                        "setup_differs": {**own, **({"workload": own_workload} if own_workload else {})}})
    return entries
