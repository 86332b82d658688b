"""The fewest replicas (and GPUs: replicas × TP × PP) that sustain an offered rate under a latency target, per
router: `kvlab capacity --replicas auto`.

    grid point × router ──▶ CountSearch (kvlab.fleet.counts: double, then bisect) ──▶ the next count N
        ──▶ a sweep point {..., replicas: N, router} on the runner ──▶ kvlab.sweep.point.simulate_point
              └─ kvlab.service.run ─▶ run_fleets: the fleet's work checked (check_fleet_work), one fleet on one clock
        ──▶ stored in the sweep store (kvlab.sweep.store) ──▶ judged as a capacity search judges a rate: its measured
            window sustained (kvlab.window) and the SLO met by the window's requests (kvlab.sweep.capacity.verdict)

Every count is a stored point, so a search stopped by Ctrl-C resumes from the counts already simulated (the runner
computes only what the store lacks), and one replica (the engine alone, as `kvlab run` runs it: a fleet of one
gives the engine's result bit for bit) is stored once for every router.

Each search runs on two samples, the workload and a longer one (kvlab.sweep.capacity.longer_sample: a trace that
keeps its own arrival times whole, up to WHOLE_TRACE_LIMIT requests; else twice the workload): the answer is the
larger count, and both are shown; it is priced (kvlab.catalog.prices) in dollars an hour and per million output
tokens at the offered rate. On a trace that keeps its own arrival times, the default sample is at most half the
trace, so that the second (the whole trace) is at least twice it; a sample given with -n whose double the trace does not hold
is answered on the one sample, saying so with the -n that would give two (kvlab.service.capacity.no_second_note).

Without --cost, every built-in cost profile that applies to the GPU prices a search of its own (as plain
``kvlab capacity`` does), and the answer shows their spread. Beside the answer, what memory alone asks of one
replica: the fewest GPUs that hold the model's weights and one max_model_len request (kvlab.sizing.fewest_gpus,
and with pipeline stages too, kvlab.service.size.fewest_pipelined: the TP x PP search ``kvlab fit`` answers with).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvlab.catalog import get_gpu, get_model
from kvlab.catalog.prices import gpu_hour_price as price_of
from kvlab.catalog.prices import serving_cost
from kvlab.config import KvlabConfig, WorkloadConfig, resolve
from kvlab.config.options import DEFAULT_NUM_REQUESTS, OPTIONS
from kvlab.config.resolve import engine_setup
from kvlab.cost.profiles import applicable_profiles, lead_profile
from kvlab.errors import KvlabError
from kvlab.fleet.counts import CountSearch
from kvlab.fleet.work import MAX_REPLICAS
from kvlab.service.capacity import cut_note, no_second_note, trace_rows, two_sample_length
from kvlab.service.engine import load, strategies
from kvlab.sizing import NODE_GPUS, fewest_gpus, settings_of
from kvlab.strategies import Strategy
from kvlab.sweep.capacity import longer_sample

DEFAULT_ROUTERS = ("round-robin", "least-requests")
TRAFFIC_SECONDS = 120  # the default workload: this long of the offered traffic, at least
# For --max-time's estimate (a search doubles until a count holds, then bisects, so its length is not known before it
# runs): docs/fleet.md's example searches took 4 counts (1, 2, 4, 3) and 6 (1, 2, 4, 8, 6, 5).
TYPICAL_COUNTS = 5


def replicas_text(n: int) -> str:
    """'1 replica', '4 replicas'."""
    return f"{n} replica{'' if n == 1 else 's'}"


@dataclass
class FewestReplicasSearch:
    """One search over the replica count: ``point``'s engine behind ``router``, with each count's stored window,
    verdict and p99 TTFT."""

    point: dict[str, Any]  # the grid point as given (its strategy and cost among its options)
    router: str
    options: dict[str, Any]  # the options every count shares (the workload's length put in)
    config: KvlabConfig  # the setup (resolved with 2 replicas: a router needs a fleet; N is searched)
    strategy: str
    spec: Strategy  # (its prefix caching, for the setup)
    counts: CountSearch
    num_requests: int  # the sample's length
    mean_output_tokens: float  # (for the cost per million output tokens)
    factor: int = 1  # 1: the workload; 2: the second sample (longer_sample's)
    second: FewestReplicasSearch | None = None  # (a first sample's) its second sample, or None and why in no_second
    no_second: str | None = None
    length_note: str | None = None  # (a first sample's) why it is shorter than the default length
    windows: dict[int, dict[str, Any] | None] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    ttft_p99: dict[int, float | None] = field(default_factory=dict)
    error: str | None = None  # a count that failed to simulate (refused as too much work, ...) ends the search
    verdicts: dict[int, Any] = field(default_factory=dict)  # each count's kvlab.sweep.slo.Verdict
    slo: Any = None  # the target the counts were judged by (judge's)

    @property
    def cost(self) -> str:
        return self.point["cost"]

    def count_point(self, n: int) -> dict[str, Any]:
        """Count ``n`` as a sweep point. One replica routes nothing: it is the engine alone, at the router's
        defaults (one stored point for every router)."""
        if n == 1:
            routed = {"router": OPTIONS["router"].default, "router_scorers": OPTIONS["router_scorers"].default}
        else:
            routed = {"router": self.router}
        return {**self.options, **routed, "strategy": self.strategy, "replicas": n}

    @property
    def unreachable(self) -> str | None:
        """Why no count will hold: the last two counts judged (none held yet) both sustained with nothing waiting
        and missed the same terms by the same values (kvlab.sweep.capacity.at_latency_floor, the rate search's rule),
        or, a doubling apart and both sustained, the last doubling gained less than the target still needs, which is
        all further doublings could gain (kvlab.sweep.capacity.beyond_reach). None otherwise."""
        from kvlab.sweep.capacity import at_latency_floor, beyond_reach

        judged = list(self.counts.held)
        if self.counts.num_replicas is not None or len(judged) < 2:
            return None
        a, b = judged[-2:]
        pair = [self.verdicts[a], self.verdicts[b]], [self.windows[a], self.windows[b]]
        if at_latency_floor(*pair):
            return (f"{self.verdicts[b].reason} with {replicas_text(b)} as with {replicas_text(a)}, nothing waiting: "
                    "one request's own latency on an idle replica is above the target, whatever the count")
        if self.slo is not None and (why := beyond_reach(*pair, self.slo)) is not None and b == 2 * a:
            return f"with {replicas_text(b)} {why}: one request's own latency on an idle replica is above the target"
        return None

    def judge(self, n: int, row: dict[str, Any], slo) -> bool:
        from kvlab.sweep.capacity import verdict, window_p99_ttft

        judged, window = verdict(slo, row)
        self.slo = slo
        summary = json.loads(row["summary"])
        self.windows[n], self.reasons[n], self.verdicts[n] = window, judged.reason, judged
        # (over the measured window, what the target judges; the whole run's where the row has no window)
        p99 = window_p99_ttft(row)
        self.ttft_p99[n] = summary["ttft_s"]["p99"] if p99 is None else p99
        self.counts.record(n, judged.held)
        return judged.held


def replica_searches(lists: dict[str, list], explicit: list[dict]) -> tuple[float, list[FewestReplicasSearch]]:
    """The searches a command line asks for (its grid's lists and explicit points, --replicas auto taken out): one
    per grid point, cost profile (each that applies to the GPU without --cost) and router (--router, default
    DEFAULT_ROUTERS), then the same again on the second sample (longer_sample's, ``factor`` 2), with the offered
    rate. Refused, in one line, without one --rate or with routers in --grid."""
    from kvlab.sweep.grid import expand

    rates = lists.get("rate", [])
    if len(rates) != 1:
        raise KvlabError("kvlab capacity --replicas auto finds the fewest replicas for one offered rate: give "
                         "--rate R (req/s, the whole fleet's traffic)")
    routers = list(dict.fromkeys(lists.pop("router", list(DEFAULT_ROUTERS))))  # (each once)
    if any("router" in p or "replicas" in p for p in explicit):
        raise KvlabError("--replicas auto: give the routers on the command line (--router a,b), not in --grid")
    given_length = "num_requests" in lists or "duration" in lists
    points = expand(lists, explicit)
    if not ("cost" in lists or any("cost" in p for p in explicit)):  # the clock's uncertainty, as kvlab capacity's
        points = [{**p, "cost": name} for p in points for name in applicable_profiles(get_gpu(p["gpu"]).id)]
    # (with several routers, --router-scorers are weighted's: the others are searched without them, as a sweep's)
    firsts = [_first_sample(point if router == "weighted" or len(routers) == 1 else
                            {**point, "router_scorers": OPTIONS["router_scorers"].default}, router, given_length)
              for point in points for router in routers]
    for first in firsts:
        first.second = _second_sample(first)
    return float(rates[0]), firsts + [first.second for first in firsts if first.second is not None]


def _first_sample(point: dict[str, Any], router: str, given_length: bool) -> FewestReplicasSearch:
    """The search on the workload: as given with -n or --duration, else first_sample_options' length."""
    options = {k: v for k, v in point.items() if k not in ("strategy", "replicas", "router")}
    options, length_note = first_sample_options(options, given_length, {"router": router, "replicas": 2})
    search = _search(point, router, options)
    search.length_note = length_note
    return search


def first_sample_options(options: dict[str, Any], given_length: bool,
                         fleet: dict[str, Any] | None = None) -> tuple[dict[str, Any], str | None]:
    """A search's first sample: ``options`` as given with -n or --duration, else TRAFFIC_SECONDS of the offered
    traffic (at least DEFAULT_NUM_REQUESTS requests, at most half a trace that keeps its own arrival times), with
    why it is shorter than that when a trace cut it (None: not cut). ``fleet``: the options that resolve the
    workload's setup (a router needs a fleet)."""
    if given_length:
        return options, None
    wanted = max(DEFAULT_NUM_REQUESTS, math.ceil(options["rate"] * TRAFFIC_SECONDS))
    rows = trace_rows(resolve({k: v for k, v in {**options, **(fleet or {})}.items() if k != "strategy"}).workload)
    options = {**options, "num_requests": two_sample_length(wanted, rows)}
    if rows is not None and options["num_requests"] != wanted:
        return options, cut_note(options["workload"], rows, wanted, options["num_requests"])
    return options, None


def second_sample_options(options: dict[str, Any],
                          workload: WorkloadConfig) -> tuple[dict[str, Any] | None, str | None]:
    """The second sample's options (kvlab.sweep.capacity.longer_sample: a trace with its own arrival times whole, up
    to WHOLE_TRACE_LIMIT requests; else twice the first's workload, ``options`` resolved to ``workload``), or None
    with why: a trace shorter than twice the first sample (with the -n that would do)."""
    rows, n = trace_rows(workload), workload.num_requests
    if workload.duration is not None:
        return longer_sample(options), None
    if rows is not None and n is not None and 2 * n > rows:
        return None, no_second_note(options["workload"], rows, n)
    return longer_sample({**options, "num_requests": options.get("num_requests") or n}, rows), None


def _second_sample(first: FewestReplicasSearch) -> FewestReplicasSearch | None:
    """The search on the second sample (``factor`` 2), or None with why in ``first.no_second``: a trace
    shorter than twice the first sample (with the -n that would do), or another reason it cannot be built."""
    options, first.no_second = second_sample_options(first.options, first.config.workload)
    if options is None:
        return None
    try:
        return _search(first.point, first.router, options, factor=2)
    except KvlabError as exc:
        first.no_second = f"no second sample: {exc}"
        return None


def _search(point: dict[str, Any], router: str, options: dict[str, Any], factor: int = 1) -> FewestReplicasSearch:
    """One search: ``point``'s engine behind ``router`` on the workload of ``options``."""
    config = resolve({**options, "router": router, "replicas": 2})  # (a router needs a fleet; N is searched)
    spec = strategies([point["strategy"]], config)[0]
    requests = load(config).requests
    mean_output = sum(r.num_output_tokens for r in requests) / max(1, len(requests))
    return FewestReplicasSearch(point, router, options, config, spec.name, spec,
                                CountSearch(first=1, max_replicas=MAX_REPLICAS), len(requests), mean_output, factor)


def search_fewest_replicas(searches: list[FewestReplicasSearch], runner, slo,
                           on_judged: Callable[[FewestReplicasSearch, int, bool], None] | None = None) -> None:
    """Every search to its answer, all advancing together: each round computes the next count of every unfinished
    search at once on ``runner`` (kvlab.sweep.runner.Runner: the counts its store holds are read, not simulated
    again), and judges them. ``on_judged(search, n, held)`` after each verdict (a progress line)."""
    runner.in_rounds = True  # (the progress' total: the counts asked for so far; each round asks for more)
    while True:
        batch = [(s, n) for s in searches
                 if s.error is None and s.unreachable is None and (n := s.counts.next_count()) is not None]
        if not batch:
            return
        rows = runner.run([s.count_point(n) for s, n in batch])
        for (search, n), row in zip(batch, rows):
            if row["status"] != "ok":
                search.error = f"{replicas_text(n)}: {row['error']}"
                continue
            held = search.judge(n, row, slo)
            if on_judged is not None:
                on_judged(search, n, held)


@dataclass
class ReplicasAnswer:
    """The searches' answers as a report reads them: one entry per search on the workload (with its second sample
    beside it, and what the answer costs), the spread over cost profiles, the setup every search shares."""

    rate: float
    entries: list[dict[str, Any]]
    spreads: list[dict[str, Any]]
    costs: list[str]
    setup: dict[str, Any]
    lead: str  # the cost profile with the best evidence for the GPU (kvlab.cost.profiles.lead_profile)
    gpu: str = ""  # the catalogue's id of each replica's GPU


def answer(rate: float, searches: list[FewestReplicasSearch], gpu_hour_price: float | None = None) -> ReplicasAnswer:
    """The answer of ``searches`` (replica_searches'): each search on the workload paired with its second sample;
    priced at ``gpu_hour_price`` (--gpu-hour-price) or the catalogue's price of the GPU."""
    firsts = [s for s in searches if s.factor == 1]
    unreachable = [s.unreachable for s in firsts if s.unreachable]
    if unreachable and len(unreachable) == len(firsts):
        raise KvlabError(f"the target cannot be met with any number of replicas: {unreachable[0]}; valid: a looser "
                         "--slo")
    entries = [_with_second(_entry(s), None if s.second is None else _entry(s.second), gpu_hour_price, rate)
               for s in firsts]
    costs = list(dict.fromkeys(e["cost"] for e in entries))
    setup = {**firsts[0].config.describe(), **engine_setup(firsts[0].config, [s.spec for s in firsts])}
    for key in ("replicas", "router", *(("cost", "cost_source") if len(costs) > 1 else ())):
        setup.pop(key, None)
    parallel = firsts[0].config.parallel
    setup["num_gpus"] = parallel.tensor_parallel_size * parallel.pipeline_parallel_size  # (each replica's)
    gpu = get_gpu(firsts[0].config.device.gpu).id
    return ReplicasAnswer(rate, entries, _spreads(firsts, entries), costs, setup, lead_profile(gpu, costs), gpu)


def _entry(s: FewestReplicasSearch) -> dict[str, Any]:
    config, counts = s.config, s.counts
    gpus_each = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    runs = []
    for n in counts.tried:
        w = s.windows.get(n) or {}
        runs.append({"replicas": n, "gpus": n * gpus_each, "held": counts.held[n], "ttft_p99_s": s.ttft_p99[n],
                     "state": w.get("state"), "served_share": w.get("served_share"), "loaded": w.get("loaded"),
                     "reason": s.reasons.get(n, "")})
    found = counts.num_replicas if s.error is None else None
    at = (s.windows.get(found) or {}) if found else {}
    entry = {"strategy": s.strategy, "router": s.router, "cost": s.cost, "replicas": found,
             "num_requests": s.num_requests, "mean_output_tokens": s.mean_output_tokens, "gpus_each": gpus_each,
             "gpu": config.device.gpu, "gpus": None if found is None else found * gpus_each,
             "may_be_too_few": bool(at) and not at.get("loaded", True),
             "fewer_limited_by": _fewer_limited_by(s), "memory": memory_per_replica(config), "runs": runs,
             "no_second": s.no_second, "length_note": s.length_note, "unreachable": s.unreachable}
    return entry if s.error is None else {**entry, "error": s.error}


def _with_second(first: dict[str, Any], second: dict[str, Any] | None, gpu_hour_price: float | None,
                 rate: float) -> dict[str, Any]:
    """The first sample's entry with the second's answer beside it; the answer is the larger count (None when
    either found none), priced (kvlab.catalog.prices) at the offered rate. Without a second sample (``second``
    None: the first entry's ``no_second`` says why), the answer is the first's."""
    if second is None:
        entry = {**first, "samples": {"lengths": [first["num_requests"]], "replicas": [first["replicas"]],
                                      "agree": None, "answered_by": first["num_requests"], "other_runs": [],
                                      "note": first["no_second"]}}
        return _priced(entry, first, gpu_hour_price, rate)
    counts = [first["replicas"], second["replicas"]]
    answer = None if None in counts else max(counts)
    # The entry is the sample that gave the answer (its runs, what limited one fewer there); the other beside it.
    chosen, other = (second, first) if counts[0] is not None and answer != counts[0] else (first, second)
    entry = {**chosen, "samples": {"lengths": [first["num_requests"], second["num_requests"]], "replicas": counts,
                                   "agree": counts[0] == counts[1], "answered_by": chosen["num_requests"],
                                   "other_runs": other["runs"], "note": first["length_note"]},
             "replicas": answer, "gpus": None if answer is None else answer * first["gpus_each"]}
    return _priced(entry, first, gpu_hour_price, rate)


def _priced(entry: dict[str, Any], first: dict[str, Any], gpu_hour_price: float | None,
            rate: float) -> dict[str, Any]:
    """``entry`` with what its answer costs at the offered rate (None: no price known, or no answer), its tokens
    those of the sample that gave the answer (a trace's first rows or its whole: the entry's own mean answer)."""
    price = price_of(get_gpu(first["gpu"]).id, gpu_hour_price)
    entry["serving_cost"] = None if price is None or entry["replicas"] is None else {
        **serving_cost(price, entry["gpus"], rate, entry["mean_output_tokens"]),
        "usd_per_gpu_hour": price.usd_per_gpu_hour, "price_as_of": price.as_of, "price_source": price.source}
    return entry


def _fewer_limited_by(s: FewestReplicasSearch) -> str | None:
    """What failed one replica fewer than the answer (or at the most tried, when none held): "latency: missed
    p99_ttft<2s (2.97 s) with 3 replicas", "throughput: overloaded (...) with 2 replicas" (the words of
    kvlab.sweep.capacity's limited_by). None when the answer is the first count tried."""
    from kvlab.sweep.capacity import LIMITS

    counts = s.counts
    n = counts.max_replicas if counts.num_replicas is None else counts.num_replicas - 1
    if n not in s.reasons and counts.num_replicas is None and s.reasons:
        n = max(s.reasons)  # (the search stopped before the most it may try: out of reach, unreachable says)
    if n not in s.reasons:
        return None
    kind = next((k for word, k in LIMITS.items() if word in s.reasons[n]), "run")
    return f"{kind}: {s.reasons[n]} with {replicas_text(n)}"


def memory_per_replica(config: KvlabConfig) -> dict[str, Any]:
    """What memory alone asks of one replica, as `kvlab fit` answers it: the fewest GPUs (on the run's GPU, at its
    pipeline parallelism) that hold the model's weights and one max_model_len request (kvlab.sizing.fewest_gpus),
    and, where the run has no pipeline stages, the fewest with them too (kvlab.service.size.fewest_pipelined: TP x
    PP, where it differs), against the run's TP × PP; ``starts`` False: vLLM would refuse to start such a replica."""
    from kvlab.service.size import fewest_pipelined

    sizing = config.sizing
    gpu = replace(get_gpu(config.device.gpu), memory_bytes=config.device.gpu_memory_bytes)  # (--gpu-memory-gib)
    has = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    memory: dict[str, Any] = {"model": sizing.model_id, "gpu": gpu.id, "gpus_per_replica": has,
                              "max_model_len": sizing.max_model_len}
    model, settings = get_model(config.model.model), settings_of(sizing)
    try:
        tp: int | None = fewest_gpus(model, gpu, settings)[0]
    except KvlabError as exc:
        tp = None
        memory.update(fewest_gpus_per_replica=None, tensor_parallel_size=None, starts=False, note=str(exc))
    piped = fewest_pipelined(model, gpu, settings, tp)
    memory["fewest_gpus_pipelined"] = None if piped is None else {
        "tensor_parallel_size": piped[0], "pipeline_parallel_size": piped[1], "num_gpus": piped[0] * piped[1],
        "node_gpus": NODE_GPUS}
    if tp is None:
        return memory
    fewest = tp * config.parallel.pipeline_parallel_size
    return {**memory, "fewest_gpus_per_replica": fewest, "tensor_parallel_size": tp, "starts": has >= fewest}


def _spreads(searches: list[FewestReplicasSearch], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each configuration but its cost profile searched under several: the answer under each profile."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for s, e in zip(searches, entries):
        key = {k: v for k, v in s.point.items() if k != "cost"}
        groups.setdefault(json.dumps({**key, "router": s.router}, sort_keys=True, default=str), []).append(e)
    spreads = []
    for group in groups.values():
        if len(group) < 2:
            continue
        found = [e["replicas"] for e in group if e["replicas"] is not None]
        spreads.append({"strategy": group[0]["strategy"], "router": group[0]["router"],
                        "replicas": {e["cost"]: e["replicas"] for e in group},
                        "gpus": {e["cost"]: e["gpus"] for e in group},
                        "fewest": min(found, default=None), "most": max(found, default=None),
                        "all_found": len(found) == len(group)})
    return spreads
