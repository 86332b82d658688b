"""Running: the one way every face runs the simulator, a resolved configuration and strategies in, results out.

    options ──▶ kvlab.config.resolve ──▶ KvlabConfig ──┐
    strategy names ──▶ strategies(names, config) ──────┼──▶ run(config, strategies) ──▶ RunResult
    (a workload of the face's own: bench's sent requests)┘      │ checks the work first (kvlab.validate)
                                                                │ loads the workload once
                                                                │ one Simulation per strategy, on the same requests
                                                                │ a profile's request latency around each run
                                                                └ the notes: options unused, what vLLM would refuse

The CLI (run, race), a sweep's points, capacity's searches, the paper's figures, the lab and its export, bench
``--compare`` and ``vllm compare``'s kvlab side all come through here, so one question gets one answer wherever
it is asked. A face that steps the engine itself (the lab's grid) asks ``start`` for the simulations and
``finish`` for each result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.config import KvlabConfig, WorkloadConfig, min_num_gpu_blocks
from kvlab.errors import KvlabError
from kvlab.strategies import Strategy
from kvlab.window import MIN_WINDOW_REQUESTS, Window, measure_run, window_num_requests

if TYPE_CHECKING:
    from kvlab.disagg.result import DisaggResult
    from kvlab.fleet import FleetResult
    from kvlab.sim import SimResult, Simulation
    from kvlab.workload import Workload

# (strategy name, requests done, requests in all), now and then during a run
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class RunResult:
    """What one run of the service gives: its configuration, the workload, one result per strategy (as clients
    see them: a profile's request latency included), and what the run says beside its numbers."""

    config: KvlabConfig
    workload: Workload
    results: tuple[SimResult, ...]
    notes: tuple[str, ...] = ()
    # With --replicas N > 1, each strategy's fleet (kvlab.fleet.FleetResult: the replicas, the router's
    # decisions); ``results`` then holds each fleet as one engine's result (FleetResult.as_result).
    fleets: tuple[FleetResult, ...] = ()
    # With --prefill-replicas / --decode-replicas, each strategy's disaggregated fleet (kvlab.disagg); ``results``
    # then holds each as one engine's result, on the clients' clock.
    disaggregated: tuple[DisaggResult, ...] = ()

    def summaries(self) -> list[dict[str, Any]]:
        """Each strategy's summary, as `kvlab run --json` and a sweep's store hold it: with its fleet's (the router's
        load imbalance, prefix hits, each replica) or its disaggregated fleet's figures where it has one."""
        summaries = [r.summary() for r in self.results]
        for summary, fleet in zip(summaries, self.fleets):
            summary["fleet"] = {k: v for k, v in fleet.summary().items() if k != "fleet"}
        for summary, disaggregated in zip(summaries, self.disaggregated):
            summary["disaggregation"] = disaggregated.disaggregation()
        return summaries

    def setup(self) -> dict[str, Any]:
        """The run described: the configuration's setup, the workload as built, the notes."""
        wl = self.workload
        return {**self.config.describe(), "workload_description": wl.description, "num_requests": wl.num_requests,
                "strategies": [r.strategy.name for r in self.results], "notes": list(self.notes)}

    def windows(self) -> list[Window]:
        """Each strategy's measured window (kvlab.window: whether the run sustained its rate), as a capacity search
        and the run's overload sentence judge it: with the seats of every replica that holds a request for its
        answer (a disaggregated fleet's decode replicas), and a disaggregated fleet's decode queue judged beside its
        prefill queue."""
        engine, disagg = self.config.engine, self.config.disagg
        serving = disagg.num_decode_replicas if disagg is not None else self.config.parallel.data_parallel_size
        decode = [[r for side in fleet.decode for r in side.records] for fleet in self.disaggregated]
        return [measure_run(r.records, r.strategy.allocator, self.workload.requests, engine.scheduler,
                            self.config.for_strategy(r.strategy).cache.num_slots, serving, decode[i] if decode else None)
                for i, r in enumerate(self.results)]

    def overloaded_rps(self) -> float | None:
        """The offered rate when every strategy is overloaded at it (its waiting queue grows: kvlab.window's
        measured window, one that held at least MIN_WINDOW_REQUESTS arrivals), else None."""
        offered, each = self.overloaded()
        return offered if each and all(each) else None

    def overloaded(self) -> tuple[float | None, list[bool]]:
        """The offered rate over the measured window (None without a window) and, for each strategy, whether it is
        overloaded at it (its waiting queue grows over a window of at least MIN_WINDOW_REQUESTS arrivals): a race
        says so of each, not only when every one is (trial 58, finding 4)."""
        windows = self.windows()
        each = [w.state == "overloaded" and w.num_arrived >= MIN_WINDOW_REQUESTS for w in windows]
        return (windows[0].offered_rps if windows else None), each

    def too_short_to_judge(self) -> tuple[Window, int] | None:
        """A window whose queue grew on fewer than MIN_WINDOW_REQUESTS arrivals (too few to measure anything, as a
        capacity search refuses such a workload), with the requests a run needs to put twice the engine's seats in
        the window; None when every overloaded window had enough."""
        short = [w for w in self.windows() if w.state == "overloaded" and w.num_arrived < MIN_WINDOW_REQUESTS]
        return (short[0], window_num_requests(short[0].num_seats)) if short else None


def strategies(names: Sequence[str | Strategy], config: KvlabConfig | None = None) -> list[Strategy]:
    """Strategies by name (kvlab.strategies), with the configuration's --preemption-mode put into each, each at
    most once; one vLLM would not start with on this configuration is refused (KvlabConfig.check_prefix_caching)."""
    from kvlab.strategies import check_distinct, parse_strategy, with_preemption_mode

    mode = config.scheduler.preemption_mode if config is not None else None
    parsed = [with_preemption_mode(n if isinstance(n, Strategy) else parse_strategy(n), mode) for n in names]
    check_distinct(parsed)
    for strategy in parsed:
        if config is not None:  # (a hybrid's prefix caching without chunked prefill, refused as vLLM does)
            config.check_prefix_caching(strategy)
    if config is not None and any(s.preemption_mode == "swap" for s in parsed):
        config.check_swap_space()  # (a swap space too large for the machine's CPU memory, refused as vLLM does)
    return parsed


def check_work(config: KvlabConfig, num_strategies: int, what: str = "this run") -> None:
    """Refuse, before any request is drawn, a run beyond kvlab.validate's limits (the estimate says why)."""
    from kvlab.validate import check_simulation_work
    from kvlab.workload.load import estimate_workload

    wl = config.workload
    num, mean_len = estimate_workload(wl.workload, num_requests=wl.num_requests, duration=wl.duration, rate=wl.rate,
                                      arrival=wl.arrival)
    check_simulation_work(num, mean_len, num_strategies, what)


def load(config: KvlabConfig | WorkloadConfig, max_model_len: int | None = None, *,
         cap_answers: bool = False) -> Workload:
    """The workload of a configuration (or of a workload configuration alone), built once: the same requests
    for every strategy. For a workload alone, ``max_model_len`` is what long requests are clipped or answers
    capped to (``cap_answers``: the max_tokens a client sends a real server)."""
    from kvlab.workload import load_workload

    if isinstance(config, KvlabConfig):
        workload, max_model_len = config.workload, config.scheduler.max_model_len
        if workload.sessions:
            from kvlab.workload.sessions import check_context_cap

            check_context_cap(dict(workload.sessions).get("max_context_len"), max_model_len)
    else:
        workload = config
    return load_workload(workload.workload, **workload.load_options(max_model_len, cap_answers=cap_answers))


def notes(config: KvlabConfig, strategy_list: Sequence[Strategy] = (), workload: Workload | None = None
          ) -> tuple[str, ...]:
    """What a run of ``config`` says before its numbers: options given that it does not use, and what vLLM would
    refuse to start with though kvlab runs it. (The cost profile's notes travel on the cost model.) ``workload``:
    the configuration's, when loaded already (a priority policy over one class loads it otherwise: _one_class)."""
    from kvlab.workload.load import copy_note, order_note

    given = dict(config.given)
    said = [note for note in (copy_note(config.workload.workload), order_note(config.workload.workload)) if note]
    said += _one_class(config, workload)
    said += _limits(config)
    said += config.cache.notes
    if "swap_space" in given and strategy_list and not any(s.preemption_mode == "swap" for s in strategy_list):
        said.append(f"--swap-space {given['swap_space']:g} is not used: no strategy here swaps (a +swap strategy, "
                    "or --preemption-mode swap, would)")
    swaps = any(s.preemption_mode == "swap" for s in strategy_list)
    slabs = [s.name for s in strategy_list if s.allocator != "paged"]
    if given.get("preemption_mode") and slabs:  # (trial 58, finding 16: accepted silently)
        said.append(f"--preemption-mode {given['preemption_mode']} does not change {', '.join(slabs)}: a reservation "
                    f"scheme reserves each request's whole answer at admission, so it never preempts")
    for s in strategy_list:
        if s.preemption_mode == "swap" and s.name.split("+")[0] == "vllm":
            said.append(f"{s.name}: the vLLM kvlab mirrors cannot run this: V1's scheduler preempts by recompute only "
                        "(swapping to CPU memory was V0's); kvlab swaps as V0 did, to show what it would cost")
    if "cpu_memory_gib" in given and strategy_list and config.offload is None and not swaps:
        said.append(f"--cpu-memory-gib {given['cpu_memory_gib']:g} is not used: it bounds a CPU tier "
                    "(--kv-offloading-size) and a swapping strategy's --swap-space, and there is neither")
    if given.get("available_kv_gib") and given.get("num_gpu_blocks"):
        said.append(f"--num-gpu-blocks {given['num_gpu_blocks']} sets the pool (as vLLM's "
                    f"--num-gpu-blocks-override does): --available-kv-gib {given['available_kv_gib']:g} is not used")
    cache, max_model_len = config.cache, config.scheduler.max_model_len
    least, groups = min_num_gpu_blocks(max_model_len, cache.block_size), ""
    if cache.kv_cache_groups:  # (a hybrid: blocks in every KV cache group, as vLLM counts them at startup)
        from kvlab.sizing import blocks_per_request

        sized = config.sizing
        least = blocks_per_request(sized.kv_cache_groups, max_model_len, sized.max_in_flight_tokens,
                                   sized.decode_context_parallel_size) + 1
        groups = f" in its {len(cache.kv_cache_groups)} KV cache groups"
    if cache.num_gpu_blocks < least:
        said.append(f"vLLM would refuse to start with this pool: one {max_model_len:,}-token request "
                    f"(--max-model-len) needs {least - 1:,} blocks of {cache.block_size}{groups}, more than the "
                    f"{cache.num_gpu_blocks - 1:,} usable (the null block aside); kvlab runs it anyway, and a request "
                    "that can never fit is rejected")
    uses_prefix = config.router.router == "prefix" or (config.router.router == "weighted"
                                                       and "prefix:" in config.router.router_scorers)
    if config.parallel.data_parallel_size > 1 and uses_prefix:
        blind = [s.name for s in strategy_list if not s.enable_prefix_caching]
        if blind:
            said.append(f"--router {config.router.router} reads the replicas' prefix caches, and {', '.join(blind)} "
                        f"cache{'s' if len(blind) == 1 else ''} no prefixes (every lookup misses): give "
                        f"{blind[0]}+prefix")
    from kvlab.sizing import cuda_block_size_note

    block_note = cuda_block_size_note(cache.block_size)
    if block_note:
        said.append(block_note)
    if "quantization" in given:  # (none on a quantized checkpoint: vLLM reads its quantization_config all the same)
        from kvlab.catalog import get_model
        from kvlab.sizing import quantization_note

        quantized = quantization_note(get_model(config.model.model), given["quantization"])
        if quantized:
            said.append(quantized)
    spec = config.speculative
    if spec is not None and spec.draft_model and spec.draft_cost_ratio > 1:
        said.append(f"--speculative-model {spec.draft_model} is larger than the target {config.model.model} "
                    f"({spec.draft_cost_ratio:.1f}x its active parameters): each draft costs more than the step it "
                    "saves, so speculative decoding can only slow this run down")
    return tuple(said)


def _limits(config: KvlabConfig) -> list[str]:
    """-n and --duration both given: neither wins alone, whichever limit comes first does (trial 55, finding 12: it
    passed silently). Only a user sets both: a default fills -n only where neither is given."""
    num, duration = config.workload.num_requests, config.workload.duration
    if num is None or duration is None:
        return []
    return [f"-n {num:,} and --duration {duration:g} both given: the run serves the requests arriving in the first "
            f"{duration:g} s, at most {num:,} of them (whichever limit comes first)"]


def _one_class(config: KvlabConfig, workload: Workload | None) -> list[str]:
    """A priority policy (--scheduling-policy, --gateway-queue-policy) over a workload whose requests are all of one
    class orders nothing: it runs as fcfs, said so (trial 51: it ran silently)."""
    admission = config.admission
    policies = [f"--{name} priority" for name, on in (
        ("scheduling-policy", config.scheduler.scheduling_policy == "priority"),
        ("gateway-queue-policy", admission is not None and admission.queue_policy == "priority")) if on]
    if not policies:
        return []
    from kvlab.workload.priority import parse_classes

    if config.workload.priority_classes:  # (as kvlab.service.classes.declared_classes reads them, a layer above)
        classes = {number for number, _ in parse_classes(config.workload.priority_classes)}
    else:
        classes = {r.priority for r in (workload if workload is not None else load(config)).requests}
    if len(classes) > 1:
        return []
    return [f"{' and '.join(policies)} order{'s' if len(policies) == 1 else ''} requests by their class, and every "
            f"request of this workload is class {min(classes, default=0)}: the order is first come, first served; "
            "give the classes with --priority-classes (0:0.2,1:0.8) or a workload file's priority column"]


def start(config: KvlabConfig, strategy_list: Sequence[Strategy], *, workload: Workload | None = None,
          record_iterations: bool = True, max_iterations: int | None = None) -> tuple[Workload, list[Simulation]]:
    """The workload and one Simulation per strategy, not yet run: for a face that steps them itself. A profile's
    request latency delays each request on its way to the scheduler (kvlab/cost/latency.py); ``finish`` puts
    the clients' times back."""
    from kvlab.cost.latency import delayed
    from kvlab.sim import MAX_RUN_ITERATIONS, Simulation

    if config.parallel.data_parallel_size > 1 or config.disagg is not None or config.admission is not None:
        raise KvlabError("this face steps one engine: give --replicas 1, no --prefill-replicas / --decode-replicas "
                         "and no --rate-limit (a fleet, or a gateway in front of the engine, runs through service.run)")
    wl = load(config) if workload is None else workload
    latency_s = config.engine.cost.request_latency_s
    sims = [Simulation(strategy, config.for_strategy(strategy).engine, delayed(wl, latency_s),
                       record_iterations=record_iterations, max_iterations=max_iterations or MAX_RUN_ITERATIONS)
            for strategy in strategy_list]
    return wl, sims


def finish(sim: Simulation) -> SimResult:
    """A simulation's result as its clients saw it (a profile's request latency included in TTFT and latency)."""
    from kvlab.cost.latency import as_seen_by_clients

    cost = sim.config.cost
    return as_seen_by_clients(sim.result(), cost.request_latency_s, cost.admission_lag_iterations,
                              cost.lag_jitter_iterations, cost.lag_step_probability)


def run(config: KvlabConfig, strategy_list: Sequence[Strategy | str], *, workload: Workload | None = None,
        progress: Progress | None = None, record_iterations: bool = True) -> RunResult:
    """Each strategy on the configuration's workload (or ``workload``), one after the other, on one clock each.
    The work is checked before any request is drawn."""
    chosen = strategies(strategy_list, config)
    if workload is None:
        check_work(config, len(chosen))
    if config.disagg is not None:
        return run_disaggregated(config, chosen, load(config) if workload is None else workload,
                                 record_iterations=record_iterations)
    if config.parallel.data_parallel_size > 1 or config.admission is not None:  # (a gateway: kvlab.fleet.admission)
        return run_fleets(config, chosen, load(config) if workload is None else workload,
                          record_iterations=record_iterations)
    wl, sims = start(config, chosen, workload=workload, record_iterations=record_iterations)
    results = []
    for sim in sims:
        callback = None if progress is None else (lambda done, total, name=sim.strategy.name: progress(name, done,
                                                                                                        total))
        sim.run(progress=callback)
        results.append(finish(sim))
    return RunResult(config=config, workload=wl, results=tuple(results), notes=notes(config, chosen, wl))


def run_fleets(config: KvlabConfig, strategy_list: Sequence[Strategy], workload: Workload, *,
               record_iterations: bool = True) -> RunResult:
    """Each strategy as a fleet of ``config.parallel.data_parallel_size`` replicas behind the configured router
    (kvlab.fleet), on one clock, behind the configured gateway if any (one replica then serves as a lone engine
    would); a profile's request latency is put around the fleet as ``finish`` puts it around one engine. The work
    is checked first (a fleet too large to simulate is refused with an estimate)."""
    from kvlab.fleet import Fleet, check_fleet_work

    num_replicas = config.parallel.data_parallel_size
    router = config.router.spec(config.workload.seed)
    for strategy in strategy_list:
        check_fleet_work(workload.num_requests, num_replicas, router, config.cache.num_gpu_blocks, strategy)
    fleets = tuple(Fleet(strategy, config.for_strategy(strategy).engine, workload, router, num_replicas,
                         record_iterations=record_iterations, admission=config.admission).run()
                   for strategy in strategy_list)
    return RunResult(config=config, workload=workload, results=tuple(f.as_result() for f in fleets),
                     notes=notes(config, strategy_list, workload), fleets=fleets if num_replicas > 1 else ())


def run_disaggregated(config: KvlabConfig, strategy_list: Sequence[Strategy], workload: Workload, *,
                      record_iterations: bool = True) -> RunResult:
    """Each strategy as ``config.disagg``'s prefill and decode replicas behind the configured router (kvlab.disagg),
    on one clock; a profile's request latency around the fleet, as ``finish`` puts it around one engine."""
    from kvlab.disagg.fleet import DisaggFleet

    check_disaggregated(config, strategy_list, workload)
    assert config.disagg is not None
    router = config.router.spec(config.workload.seed)
    fleets = tuple(DisaggFleet(strategy, config.for_strategy(strategy).engine, workload, router, config.disagg,
                               record_iterations=record_iterations).run() for strategy in strategy_list)
    return RunResult(config=config, workload=workload, results=tuple(f.as_result() for f in fleets),
                     notes=notes(config, strategy_list, workload), disaggregated=fleets)


def check_disaggregated(config: KvlabConfig, strategy_list: Sequence[Strategy], workload: Workload) -> None:
    """What a disaggregated fleet of ``config`` does not model, refused in one line before anything runs."""
    from kvlab.disagg.fleet import check_disagg

    assert config.disagg is not None
    if config.admission is not None:
        raise KvlabError("a gateway (--rate-limit) in front of a disaggregated fleet is not modelled; valid: drop "
                         "--rate-limit, or give it to an aggregated fleet (no --prefill-replicas / --decode-replicas)")
    for strategy in strategy_list:
        check_disagg(strategy, config.for_strategy(strategy).engine, workload)


def simulate(strategy_names: Sequence[str], progress: Progress | None = None, **options: Any) -> RunResult:
    """The library's one call: ``simulate(["vllm", "orca-max"], model="opt-13b", rate=2)``."""
    from kvlab.config import resolve

    return run(resolve(options), strategy_names, progress=progress)
