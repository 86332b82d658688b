"""Capacity: the highest request rate each configuration sustains under a latency target (`kvlab capacity`).

    the grid's points without a rate ──▶ searched_configurations: each cost profile that applies to the GPU (without
        --cost), the workload scaled to load the engine (twice its seats in the measured window, without -n or
        --duration), a window too short to measure refused
    ──▶ capacities(configurations, longer, runner, slo, ...): kvlab.sweep.capacity's searches (bracket, then bisect), every
        rate tried a sweep point stored in the runner's store (a search run again, or resumed after Ctrl-C, reads
        them), judged on its measured window (kvlab.window) against the SLO (kvlab.sweep.slo)
    ──▶ longer_samples: each configuration again on a longer sample (kvlab.sweep.capacity.longer_sample: a trace
        whole, up to WHOLE_TRACE_LIMIT requests; else twice the workload), searched alongside; the answer is the lower
        of the two, both shown with their spread
    ──▶ answer(...): an Answer: the searches with what they were searched on (engine_setups: prefix caching per
        strategy, TP/PP communication), their two samples, their spread over cost profiles, the clock with the best
        evidence for the GPU (lead), what each answer costs (kvlab.catalog.prices) and the cheapest; a target no
        rate meets refused in one line; capacity_json
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import kvlab
from kvlab import defaults
from kvlab.catalog import get_gpu
from kvlab.catalog.prices import gpu_hour_price as price_of
from kvlab.catalog.prices import serving_cost
from kvlab.config import WorkloadConfig
from kvlab.config.resolve import engine_setup
from kvlab.cost.profiles import applicable_profiles, lead_profile
from kvlab.errors import KvlabError
from kvlab.service.engine import load, strategies
from kvlab.sweep.capacity import (
    Search,
    agree,
    length_for_spread,
    longer_sample,
    sample_spread,
    search_capacities,
    verdict,
)
from kvlab.sweep.grid import expand
from kvlab.sweep.point import resolve_point, resolve_points, varied_options
from kvlab.sweep.slo import Verdict
from kvlab.window import (
    DRAIN_SHARE,
    MIN_WINDOW_REQUESTS,
    SEATS_FACTOR,
    WARMUP_SHARE,
    mean_tokens_held,
    num_seats,
    window_num_requests,
)

TYPICAL_SEARCH_RUNS = 8  # simulations a search usually takes (bracket + bisection to 5%): for the time estimate


def seats_and_rows(point: dict[str, Any], varied: set[str] | None = None) -> tuple[int, int | None]:
    """The seats of a point's engine (kvlab.window.num_seats) on its workload, and the rows of that workload when it
    keeps its own arrival times (trace_rows) (an error names the point by its ``varied`` options,
    kvlab.sweep.point.resolve_point)."""
    resolved = resolve_point(point, kvlab.__version__, varied)
    config = resolved.config
    strategy = strategies([resolved.strategy], config)[0]
    held = mean_tokens_held(strategy.allocator, load(config).requests, config.scheduler.max_model_len)
    num_slots = config.for_strategy(strategy).cache.num_slots
    seats = num_seats(config.scheduler.max_num_seqs, num_slots, held) * config.parallel.data_parallel_size
    return seats, trace_rows(config.workload)


def trace_rows(workload: WorkloadConfig) -> int | None:
    """How many requests a workload that keeps its own arrival times holds: no sample of it is longer (`kvlab run`
    stops its default there too, kvlab.config.resolve.resolve_workload). None: a workload drawn as long as asked
    (arrivals generated at the rate)."""
    from kvlab.workload.load import estimate_workload

    if workload.arrival not in ("auto", "trace"):  # (resolved: "auto" is left only on a source with arrival times)
        return None
    return estimate_workload(workload.workload, arrival=workload.arrival)[0]


def two_sample_length(num_requests: int, rows: int | None) -> int:
    """A default sample's length that leaves room for its second sample (the whole trace, at least twice it:
    longer_sample): ``num_requests``, or half the trace's ``rows`` when the trace is shorter than twice that."""
    return num_requests if rows is None or 2 * num_requests <= rows else max(1, rows // 2)


def cut_note(name: str, rows: int, wanted: int, num_requests: int) -> str:
    """Why a default sample is shorter than the length kvlab would choose (two_sample_length)."""
    return (f"{name} has {rows:,} requests with their own arrival times: the sample is {num_requests:,} (not "
            f"{wanted:,}) so that the second sample, the whole trace, is at least twice it")


def no_second_note(name: str, rows: int, num_requests: int) -> str:
    """Why a sample has no second: the trace is shorter than twice it; with the length that would do."""
    return (f"no second sample: {name} has {rows:,} requests with their own arrival times, and twice this sample's "
            f"{num_requests:,} would need {2 * num_requests:,}; -n {rows // 2:,} or fewer gives two samples (or a "
            f"trace of {2 * num_requests:,} requests or more)")


def steady_requests(seats: int) -> int:
    """The requests a run needs for SEATS_FACTOR x ``seats`` to arrive in its measured window, exactly (not
    kvlab.window.window_num_requests' hundreds and `kvlab run`'s floor of 1,000): what a source with fewer rows of
    its own is advised (longer_run_advice) and what a sample shorter than it cannot reach (a steady state)."""
    return math.ceil(SEATS_FACTOR * seats / (1 - WARMUP_SHARE - DRAIN_SHARE))


def seats_run_length(seats: int, rows: int | None) -> int:
    """The run length to advise for twice ``seats`` in the window: window_num_requests (in hundreds, at least
    1,000), or, on a source of ``rows`` requests with their own arrival times that cannot give that many, the exact
    need (steady_requests): a floor the source cannot give is not advised (trial 54, finding 1)."""
    full = window_num_requests(seats)
    return full if rows is None or full <= rows else steady_requests(seats)


def longer_run_advice(name: str, rows: int | None, wanted: int) -> str:
    """How to ask for a run of ``wanted`` requests: ``-n wanted``, or, on a workload that keeps its own arrival times
    and holds fewer (``rows``: trace_rows), its lengths drawn at arrivals of its own (--arrival poisson), since -n
    beyond its rows is refused (kvlab.config.resolve.resolve_workload; trial 53, finding 6), saying by how many
    requests the source falls short."""
    if rows is None or wanted <= rows:
        return f"-n {wanted:,}"
    return (f"--arrival poisson -n {wanted:,} (its lengths at Poisson arrivals: {name} holds only {rows:,} requests "
            f"with their own arrival times, {wanted - rows:,} too few)")


def _given(name: str, lists: dict, explicit: list[dict]) -> bool:
    return name in lists or any(name in p for p in explicit)


def searched_configurations(lists: dict, explicit: list[dict], start_rate: float):
    """The configurations to search (the grid's points without a rate), each cost profile that applies to the GPU
    when --cost is not given, and the workload scaled to each one's seats when neither -n nor --duration is (at most
    half a trace, two_sample_length); with their seats, whether they were scaled, and a note for each sample cut to
    fit its trace. A window too short to measure at the first rate is refused."""
    configurations = expand(lists, explicit)
    varied = varied_options(configurations)  # (in an error: what the user varies, not the profiles added below)
    if not _given("cost", lists, explicit):  # the clock's uncertainty: every profile that applies to the GPU

        configurations = [{**c, "cost": name} for c in configurations
                          for name in applicable_profiles(get_gpu(c["gpu"]).id)]
    scaled = not (_given("num_requests", lists, explicit) or _given("duration", lists, explicit))
    found = [seats_and_rows({**c, "rate": start_rate}, varied) for c in configurations]
    seats = [s for s, _ in found]
    notes: list[str] = []
    if scaled:
        lengths = [two_sample_length(window_num_requests(s), rows) for s, rows in found]
        notes = list(dict.fromkeys(cut_note(c["workload"], rows, window_num_requests(s), n)
                                   for c, (s, rows), n in zip(configurations, found, lengths)
                                   if rows is not None and n != window_num_requests(s)))
        configurations = [{**c, "num_requests": n} for c, n in zip(configurations, lengths)]
    _check_window(configurations, start_rate, [rows for _, rows in found], scaled)
    return configurations, seats, scaled, notes


def min_sample_requests() -> int:
    """The fewest requests a capacity search's sample may have: its measured window (the arrivals after the warm-up,
    before the drain) must hold MIN_WINDOW_REQUESTS (the command's -n and the lab's num_requests alike)."""
    return math.ceil(MIN_WINDOW_REQUESTS / (1 - WARMUP_SHARE - DRAIN_SHARE))


def _check_window(configurations: list[dict], start_rate: float, rows: list[int | None], scaled: bool) -> None:
    """A workload whose measured window would hold fewer than MIN_WINDOW_REQUESTS at the first rate measures
    nothing: refused, naming what would do: on a source of ``rows`` requests with their own arrival times too few
    for that, not an -n it refuses but its lengths at Poisson arrivals (longer_run_advice; trial 54, finding 1)."""
    share = 1 - WARMUP_SHARE - DRAIN_SHARE
    for c, own in zip(configurations, rows):
        if c.get("duration") is not None:
            expected = c["duration"] * start_rate * share
            if expected < MIN_WINDOW_REQUESTS:
                need = MIN_WINDOW_REQUESTS / share / start_rate
                raise KvlabError(f"--duration {c['duration']:g}: at the first rate ({start_rate:g} req/s) the measured "
                                 f"window (the last {share:.0%} of the arrivals) would hold "
                                 f"{_requests(expected)}; valid: --duration {math.ceil(need)} or more (or a higher "
                                 "--rate)")
        elif c.get("num_requests") is not None and c["num_requests"] * share < MIN_WINDOW_REQUESTS:
            need = min_sample_requests()
            n = c["num_requests"]
            what = f"the default sample of {n} requests" if scaled else f"--num-requests {n}"
            valid = f"-n {need} or more" if own is None or need <= own else \
                longer_run_advice(Path(str(c["workload"])).name, own, need)
            raise KvlabError(f"{what}: the measured window (the last {share:.0%} of the arrivals) would hold "
                             f"{_requests(n * share)}; valid: {valid}")


def _requests(count: float) -> str:
    """``count`` requests as the refusal says it: never rounded up to the minimum it falls short of."""
    shown = f"{count:.0f}" if count == round(count) or round(count) < MIN_WINDOW_REQUESTS else f"{count:.1f}"
    return f"{shown} request{'' if count == 1 else 's'} (fewer than {MIN_WINDOW_REQUESTS})"


def capacities(configurations: list[dict], longer: list[dict], runner, slo, start_rate: float,
               rtol: float = defaults.CAPACITY_RTOL, max_rate: float = defaults.CAPACITY_MAX_RATE,
               on_round=None) -> tuple[list[Search], list[dict[str, Any]]]:
    """Each configuration searched on its two samples: ``configurations``, then ``longer`` (longer_samples' second
    samples; empty: none), every search kvlab.sweep.capacity's (bracket, then bisect, every rate tried a point on
    ``runner``, whose store keeps it: a search run again reads them). `kvlab capacity` and the lab's rate section
    both ask this, and take each configuration's answer the same way (answering: the lower sample's), so the two
    give the same rate on one setup (trial 54, finding 4: the lab searched the first sample alone). The searches,
    and the stored rows of every rate they tried (for the curves). ``on_round``: search_capacities' progress."""
    every = configurations + longer
    searches = search_capacities(every, runner, slo, start_rates=[start_rate] * len(every), rtol=rtol,
                                 max_rate=max_rate, on_round=on_round)
    keys = [resolve_point({**c, "rate": r}, kvlab.__version__).key
            for c, s in zip(every, searches) for r, _, _ in s.probes]
    return searches, runner.store.rows(keys)


def rounds_left(searches: list[Search]) -> tuple[int, bool]:
    """About how many more rounds the searches need (search_capacities: each round tries one rate of every
    unfinished search), and whether that is only a floor (a search still doubling or halving towards its bracket:
    one more step at least, then the bisection). Bisection halves a bracket [held, failed]: ceil(log2(width / rtol))
    more steps narrow it to the search's --rtol, and a bracket first found is a factor of 2 wide."""
    most, floor = 0, False
    for search in searches:
        if search.next_rate() is None:
            continue
        if search.lo is not None and search.hi is not None:
            width = search.hi / search.lo - 1
            most = max(most, max(1, math.ceil(math.log2(width / search.rtol))))
        else:
            floor = True
            most = max(most, 1 + max(1, math.ceil(math.log2(1 / search.rtol))))
    return most, floor


def answering(first: Search, second: Search | None) -> Search:
    """The search whose capacity is a configuration's answer, of its ``first`` and ``second`` sample (None: none):
    the second's where it is lower (its run at the answer, bracket and limit are then the ones that decided), else
    the first's."""
    if second is not None and not second.error and not first.error and second.capacity < first.capacity:
        return second
    return first


def judged_at(configurations: list[dict], runner, slo, rate: float) -> list[tuple[dict[str, Any], Verdict | None]]:
    """Each configuration run at ``rate`` on ``runner`` (a stored point: a rate a search tried is read, not run
    again) and judged as a search judges a rate (kvlab.sweep.capacity.verdict): its row, and its verdict (None: the
    point failed to simulate, the row's error says why)."""
    rows = runner.run([{**c, "rate": rate} for c in configurations])
    return [(row, verdict(slo, row)[0] if row["status"] == "ok" else None) for row in rows]


def longer_samples(configurations: list[dict], start_rate: float) -> tuple[list[dict], str | None]:
    """Each configuration's second sample (kvlab.sweep.capacity.longer_sample: on a trace with its own arrival times
    the whole trace up to WHOLE_TRACE_LIMIT requests, else twice the workload), or none and why: a trace with fewer
    requests than twice the first sample (no_second_note: the -n that would do), or another reason the longer
    workload cannot be built."""
    longer = []
    for c in configurations:
        config = resolve_point({**c, "rate": start_rate}, kvlab.__version__).config
        rows, n = trace_rows(config.workload), config.workload.num_requests
        if config.workload.duration is not None:
            rows = None
        elif rows is not None and n is not None and 2 * n > rows:
            return [], no_second_note(c["workload"], rows, n)
        longer.append(longer_sample(c, rows))
    try:
        resolve_points([{**c, "rate": start_rate} for c in longer], kvlab.__version__)
    except KvlabError as exc:
        return [], f"no second sample: {exc}"
    return longer, None


def searched_what(longer: list[dict]) -> str:
    """What a capacity answer searches, for the time estimate: the workload and its second samples (longer_samples:
    on a trace the whole trace, which can be far longer than -n)."""
    if not longer:
        return "the workload; no second sample"
    lengths = sorted({c["num_requests"] for c in longer if c.get("duration") is None and c.get("num_requests")})
    if not lengths:
        return "the workload and one twice its duration"
    return f"the workload and a longer sample of {', '.join(f'{n:,}' for n in lengths)} requests"


def engine_setups(points) -> list[dict[str, Any]]:
    """Each resolved point's setup: kvlab.config's description with its strategy's prefix caching and the TP/PP
    communication (kvlab.config.resolve.engine_setup)."""
    # (each under the strategy as it was asked for: `vllm+prefix` is `vllm`'s point, and answered as asked)
    return [{**p.config.describe(), **engine_setup(p.config, strategies([p.options["strategy"]], p.config))}
            for p in points]


def answer(configurations: list[dict], longer: list[dict], no_second: str | None, searches: list[Search], first_points,
           seats: list[int], slo, scaled: bool, gpu_hour_price: float | None = None,
           length_notes: list[str] | None = None) -> Answer:
    """The Answer of ``searches`` (capacities' over ``configurations`` then ``longer``, the second samples), their
    setups read from ``first_points`` (each configuration resolved at the first rate), priced at ``gpu_hour_price``
    (--gpu-hour-price) or the catalogue's, with ``length_notes`` (searched_configurations': samples cut to fit their
    trace). A target that no rate meets for any configuration is refused."""
    unreachable = [s.unreachable for s in searches if s.unreachable]
    if unreachable and len(unreachable) == len(searches):
        raise KvlabError(f"--slo {slo.text!r} cannot be met at any rate: {unreachable[0]}; valid: a looser target")
    found = Answer(configurations, searches[:len(configurations)], engine_setups(first_points), seats, slo, scaled)
    found.add_samples(longer, searches[len(configurations):], no_second)
    rows = [trace_rows(p.config.workload) for p in first_points]
    found.whole_trace = [r is not None and c.get("num_requests") == r for c, r in zip(longer, rows)]
    found.trace_rows = rows
    longer_configs = None if no_second is not None else \
        [resolve_point({**c, "rate": p.options["rate"]}, kvlab.__version__).config for c, p in zip(longer, first_points)]
    found.add_costs([p.config for p in first_points], gpu_hour_price, longer_configs)
    found.length_notes = list(length_notes or [])
    return found


class Answer:
    """The searches with what they were searched on: a report's material."""
    SETUP_FIELDS = ("model", "gpu", "num_gpus", "tensor_parallel_size", "pipeline_parallel_size", "replicas",
                    "num_gpu_blocks", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                    "enable_chunked_prefill", "cost")

    def __init__(self, configurations, searches, setups, seats, slo, scaled: bool):
        self.configurations, self.searches, self.setups, self.seats = configurations, searches, setups, seats
        self.slo, self.scaled = slo, scaled
        self.longer: list[dict] = []
        self.second: list[Search] = []
        self.no_second: str | None = "no second sample searched"
        self.whole_trace: list[bool] = []  # each second sample: the whole of a trace with its own arrival times
        self.prices: list = [None] * len(configurations)
        self.num_gpus = [1] * len(configurations)
        self.mean_outputs = [0.0] * len(configurations)
        self.second_mean_outputs: list[float] = []  # the second samples' (empty: none searched)
        self.length_notes: list[str] = []  # samples cut to fit their trace (searched_configurations)
        self.trace_rows: list[int | None] = [None] * len(configurations)  # each workload's own arrivals (trace_rows)

    def longer_run_advice(self, i: int, seats: int) -> str:
        """How to ask configuration ``i`` for a run that puts twice ``seats`` in its window (seats_run_length,
        longer_run_advice)."""
        rows = self.trace_rows[i]
        return longer_run_advice(Path(str(self.configurations[i]["workload"])).name, rows,
                                 seats_run_length(seats, rows))

    def costs(self) -> list[str]:
        return list(dict.fromkeys(s["cost"] for s in self.setups))

    def add_samples(self, longer: list[dict], searches, no_second: str | None) -> None:
        """The second sample's searches (longer_sample's workload), or why there is none."""
        self.longer, self.second, self.no_second = longer, searches, no_second

    def add_costs(self, configs, gpu_hour_price: float | None, longer_configs=None) -> None:
        """Each configuration's price of a GPU-hour (kvlab.catalog.prices; ``gpu_hour_price`` overrides it), its
        GPUs and the mean answer length of each sample's workload (``longer_configs``: the second samples')."""
        self.prices = [price_of(get_gpu(c.device.gpu).id, gpu_hour_price) for c in configs]
        self.num_gpus = [c.num_gpus for c in configs]  # (a disaggregated fleet: both sides' GPUs)

        def mean_output(config) -> float:
            requests = load(config).requests
            return sum(r.num_output_tokens for r in requests) / max(1, len(requests))

        self.mean_outputs = [mean_output(c) for c in configs]
        self.second_mean_outputs = [mean_output(c) for c in longer_configs] if longer_configs else []

    def samples(self, i: int) -> dict[str, Any]:
        """Configuration ``i``'s two samples: their lengths, answers, spread, and the answer (the lower)."""
        first = self.searches[i].capacity
        length = self.configurations[i].get("num_requests") or 0
        if self.no_second is not None:
            return {"lengths": [length], "capacities": [first], "spread": None, "stable": None,
                    "num_simulations": [len(self.searches[i].probes)],
                    "answer_rps": first, "note": self.no_second}
        second = self.second[i].capacity
        spread = sample_spread(first, second)
        second_length = self.longer[i].get("num_requests") or 0
        whole = bool(self.whole_trace and self.whole_trace[i])
        return {"lengths": [length, second_length], "capacities": [first, second],
                "spread": spread, "stable": agree(spread), "whole_trace": whole,
                "steady_requests": steady_requests(self.seats[i]), "first_uncertified": self.searches[i].uncertified,
                "num_simulations": [len(self.searches[i].probes), len(self.second[i].probes)],
                "answer_rps": min(first, second),
                "length_for_stable": length_for_spread(second_length, spread) if second_length and not whole else None}

    def failed_at_lowest(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The row of the lowest rate each lead-clock configuration tried where none held (capacity 0, the search
        not failed to simulate), out of ``rows`` (capacities': every rate each search tried, in order), for a report
        to say what became of its requests (kvlab.report.tables.rows_served_nothing)."""
        lead, found, first = self.lead(), [], 0
        if len(rows) < sum(len(search.probes) for search in self.searches):  # (a row not stored: none to read)
            return []
        for config, search in zip(self.configurations, self.searches):
            probes = [rate for rate, _, _ in search.probes]
            if config["cost"] == lead and not search.error and search.lo is None and probes:
                found.append(rows[first + probes.index(min(probes))])
            first += len(probes)
        return found

    def answering(self, i: int) -> Search:
        """The search whose capacity is configuration ``i``'s answer: the second sample's where it is lower (its run
        at the answer, bracket and limit are then the ones that decided), else the first's."""
        return answering(self.searches[i], None if self.no_second is not None else self.second[i])

    def answering_length(self, i: int) -> int | None:
        """How many requests the sample that answered configuration ``i`` has (None: set by --duration)."""
        second = self.no_second is None and self.answering(i) is self.second[i]
        return (self.longer[i] if second else self.configurations[i]).get("num_requests")

    def answering_sample(self, i: int) -> str:
        """Which sample answered configuration ``i``, as a report names it: "on 300 requests" ("" with one sample)."""
        if self.no_second is not None:
            return ""
        return f"on {self.answering_length(i) or 0:,} requests"

    def cost_of(self, i: int) -> dict[str, Any] | None:
        """Dollars per hour and per million output tokens at configuration ``i``'s answer (None: no price, or no
        answer: the run at the rate it held was too short to load the engine, Search.answer)."""
        price = self.prices[i]
        if price is None or self.answering(i).answer is None:
            return None
        at = self.samples(i)["answer_rps"]
        # (the answer's sample's answers: the rate is requests of that workload, a trace's first rows or its whole)
        second = self.second_mean_outputs and self.answering(i) is self.second[i]
        mean_output = self.second_mean_outputs[i] if second else self.mean_outputs[i]
        return {**serving_cost(price, self.num_gpus[i], at, mean_output), "rate_rps": at,
                "num_gpus": self.num_gpus[i], "usd_per_gpu_hour": price.usd_per_gpu_hour, "price_as_of": price.as_of,
                "price_source": price.source, "mean_output_tokens": mean_output}

    def lead(self) -> str:
        """The cost profile (clock) the answer leads with: the one with the best evidence for the GPU
        (kvlab.cost.profiles.lead_profile)."""
        return lead_profile(get_gpu(self.configurations[0]["gpu"]).id, self.costs())

    def cheapest(self) -> dict[str, Any] | None:
        """Under the lead clock, the configuration whose answer costs least per million output tokens (its values
        in ``configuration``: which router, replicas, ... where they vary)."""
        lead = self.lead()
        priced = [(c["usd_per_million_output_tokens"], i) for i in range(len(self.configurations))
                  if self.setups[i]["cost"] == lead and (c := self.cost_of(i)) and c["usd_per_million_output_tokens"]]
        if not priced:
            return None
        value, i = min(priced)
        return {"strategy": self.configurations[i]["strategy"], "cost": lead, **(self.cost_of(i) or {}),
                "configuration": dict(self.configurations[i])}

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
        common["prefix_caching"] = {k: v for s in all_setups for k, v in s.get("prefix_caching", {}).items()}
        return common

    def spreads(self) -> list[dict[str, Any]]:
        """For each configuration but its cost profile: the capacity under each profile (its answer: the answering
        sample's), and their spread."""
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(self.configurations):
            groups.setdefault(json.dumps({k: v for k, v in c.items() if k not in ("cost", "num_requests")},
                                         sort_keys=True, default=str), []).append(i)
        spreads = []
        for indices in groups.values():
            if len(indices) < 2:
                continue
            by_cost = {self.setups[i]["cost"]: self.answering(i).capacity for i in indices}
            values = [v for v in by_cost.values() if v > 0]
            spreads.append({"strategy": self.configurations[indices[0]]["strategy"], "capacities": by_cost,
                            "low": min(values, default=0.0), "high": max(values, default=0.0),
                            "spread": (max(values) / min(values) - 1) if values else None,
                            "lead_apart": lead_apart(by_cost, self.lead())})
        return spreads


# The lead clock stands apart when its answer is more than this factor from every other clock's (kvlab capacity then
# says that its measured error does not cover this workload).
CLOCKS_APART = 2.0


def lead_apart(by_cost: dict[str, float], lead: str) -> float | None:
    """How many times the ``lead`` clock's capacity is below (< 1) or above (> 1) the nearest other clock's, when
    it is more than CLOCKS_APART from every one of them; None otherwise (or with one clock, or a zero answer)."""
    mine, others = by_cost.get(lead), [v for name, v in by_cost.items() if name != lead]
    if not mine or not others or not all(others):
        return None
    nearest = min(others, key=lambda v: abs(math.log(mine / v)))
    ratio = mine / nearest
    return ratio if max(ratio, 1 / ratio) > CLOCKS_APART else None


def capacity_json(answer: Answer, option_names) -> list[dict]:
    """Each configuration's entry: the search that answered (Answer.answering: its capacity, bracket and probes),
    both samples, the cost at the answer, and the setup (what differs from the others' apart)."""
    common = answer.common_setup()
    entries = []
    for i, c in enumerate(answer.configurations):
        setup = answer.setup_of(i)
        own = {k: v for k, v in setup.items() if k != "workload" and common.get(k) != v}
        own_workload = {k: v for k, v in setup["workload"].items() if common["workload"].get(k) != v}
        entries.append({**{n: c[n] for n in option_names if n != "rate"}, **answer.answering(i).to_json(),
                        "setup": setup,
                        "samples": answer.samples(i), "serving_cost": answer.cost_of(i),
                        "setup_differs": {**own, **({"workload": own_workload} if own_workload else {})}})
    return entries
