"""One point of a sweep: its options resolved into a configuration, run through the service, its summary out.

    point (options as given) ──▶ resolve_point ──▶ Resolved: config (KvlabConfig), strategy, key, row
                                                     │ the key: what the point resolves to, so two spellings
                                                     │ of one point are one row in the store
    worker: compute(point) ──▶ kvlab.service.run(resolve(options), [strategy]) ──▶ summary (plain data)

Points travel to workers (local or on a Ray cluster) as their options; a worker resolves them again (resolution
is idempotent and cheap) and returns plain data.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.config import KvlabConfig


@dataclass(frozen=True)
class Resolved:
    """A point resolved: the configuration it stands for, its strategy's canonical name, its identity."""

    options: dict[str, Any]  # as given (every option, defaults filled in): what a worker resolves again
    config: KvlabConfig
    strategy: str  # canonical: an option that restates its base's is dropped (kvlab.strategies.canonical_name)
    key: str
    preemption_mode: str = "recompute"  # the strategy's, --preemption-mode put into it

    @property
    def row(self) -> dict[str, Any]:
        """What the store keeps of the point: the strategy and every option at its resolved value (the preemption
        mode the strategy runs, never None), with the numbers derived from them (num_gpu_blocks, num_slots)."""
        return {"strategy": self.strategy, **self.config.to_dict(), "preemption_mode": self.preemption_mode}


def engine_options(point: dict[str, Any]) -> dict[str, Any]:
    """The point's options without its strategy: a configuration's (kvlab.config.resolve's keywords)."""
    return {name: value for name, value in point.items() if name != "strategy"}


def resolve_point(point: dict[str, Any], version: str, varied: set[str] | None = None) -> Resolved:
    """The point resolved, or the KvlabError a run of it would raise, naming the point (by its ``varied`` options
    alone when given: the ones that tell it from the other points)."""
    from kvlab import service
    from kvlab.config.resolve import quietly
    from kvlab.errors import KvlabError
    from kvlab.strategies import canonical_name
    from kvlab.sweep.grid import point_key

    try:
        config = quietly(engine_options(point))
        strategy = service.strategies([point["strategy"]], config)[0]
    except KvlabError as exc:
        raise KvlabError(f"{exc}{_in_the_point(point, varied)}") from None
    # (one simulation, one key: `vllm+prefix` is `vllm`; the strategy's name says its preemption mode)
    name = canonical_name(strategy)
    return Resolved(point, config, name, point_key(config.strategy_key, name, version), strategy.preemption_mode)


def resolve_points(points: list[dict[str, Any]], version: str, *, build: bool = True,
                   unique: bool = True) -> list[Resolved]:
    """Every point resolved and checked before anything runs, in order, points that resolve alike kept once (with
    ``unique=False``, one for each point given, as a capacity search's configurations need: ``vllm`` and
    ``vllm+prefix`` are one simulation, each answered); with
    ``build``, each distinct workload built once too (check_workloads), so that one that cannot be built is refused
    now. A caller that refuses a sweep on its estimated time first asks for ``build=False`` and checks the
    workloads of the points it will run afterwards (a million-request workload takes seconds to build)."""
    from kvlab import service
    from kvlab.errors import KvlabError

    resolved: dict[str, Resolved] = {}
    every: list[Resolved] = []
    varied = varied_options(points)
    for point in points:
        r = resolve_point(point, version, varied)
        if r.key not in resolved:
            try:
                service.check_work(r.config, 1, "a point of this sweep")
            except KvlabError as exc:
                raise KvlabError(f"{exc}{_in_the_point(r.options, varied)}") from None
        resolved.setdefault(r.key, r)
        every.append(r)
    if build:
        check_workloads(list(resolved.values()), varied)
    return list(resolved.values()) if unique else every


def check_workloads(points: list[Resolved], varied: set[str] | None = None,
                    say: Callable[[str], None] | None = None) -> None:
    """Build each distinct workload of ``points`` once: one that cannot be built is refused, naming its point.
    ``say`` hears one line first where the building takes a while (over a million requests in all)."""
    from kvlab import service
    from kvlab.errors import KvlabError

    distinct = {p.config.workload: p for p in points}
    total = sum(w.num_requests or 0 for w in distinct)
    if say is not None and total > 1_000_000:
        say(f"building the {len(distinct)} workloads of the points to run ({total:,} requests) to check them")
    for point in distinct.values():
        try:
            service.load(point.config)
        except KvlabError as exc:
            raise KvlabError(f"{exc}{_in_the_point(point.options, varied)}") from None


def cache_notes(points: list[Resolved]) -> list[str]:
    """What the points' KV caches say before a run of them does (KvlabConfig.cache.notes: a hybrid model's KV cache
    groups, per group or pooled, as `kvlab run` prints them), each distinct note once, in the points' order."""
    return list(dict.fromkeys(note for p in points for note in p.config.cache.notes))


def simulate_point(point: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The summary `kvlab run --json` prints for this point (its ``strategies[0]`` entry, a fleet's figures
    included, without the typical-iteration explanation), with its measured window (kvlab.window: whether the run
    sustained its rate), and the latencies of the window's requests (float64 bytes, kvlab.window.latencies' rows) that a capacity
    search judges."""
    from kvlab import service, window
    from kvlab.config.resolve import quietly

    run = service.run(quietly(engine_options(point)), [point["strategy"]])
    result, measured = run.results[0], run.windows()[0]
    summary = {**run.summaries()[0], "window": measured.to_dict(), **_classes(result.records, run.workload, measured)}
    return summary, window.latencies(result.records, measured).tobytes()


def _classes(records, workload, measured) -> dict[str, Any]:
    """A workload of two classes or more (kvlab.sweep.classes): each class's entry (``classes``), and the class of
    each of the window's judged requests in the order of its latencies' columns (``window_classes``), so that a
    stored run can be judged per class later."""
    from kvlab.sweep.classes import class_summaries
    from kvlab.window import judged

    class_of = {r.request_id: r.priority for r in workload.requests}
    if len(set(class_of.values())) < 2:
        return {}
    return {"classes": class_summaries(records, class_of, {}),
            "window_classes": [class_of[r.request_id] for r in judged(records, measured)]}


def compute(point: dict[str, Any]) -> dict[str, Any]:
    """Run one point in a worker: its summary, or the error that stopped it (a failed point never stops the
    sweep), with the time it took, who computed it, and that worker's kvlab version."""
    import kvlab
    from kvlab.errors import KvlabError

    start, start_cpu = time.perf_counter(), time.process_time()
    summary, latencies, error = None, None, None
    try:
        summary, latencies = simulate_point(point)
    except KvlabError as exc:  # a refusal worded for the user (too much work, a setup that cannot run): as it is
        error = str(exc)
    except Exception as exc:  # noqa: BLE001  (stored with the point and shown; the sweep goes on)
        error = f"{type(exc).__name__}: {exc}"
    return {
        "summary": summary,
        "latencies": latencies,
        "error": error,
        "elapsed_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - start_cpu,  # beside elapsed_s: how much of the wall time this worker ran
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "kvlab_version": kvlab.__version__,
    }


DEFAULTS_SHOWN = "with `kvlab run`'s defaults"


def varied_options(points: list[dict[str, Any]]) -> set[str]:
    """The options whose values differ among ``points``: what tells one from the others."""
    names = {name for point in points for name in point}
    return {n for n in names if len({repr(point.get(n)) for point in points}) > 1}


def _in_the_point(point: dict[str, Any], varied: set[str] | None) -> str:
    """Which point an error is about: its options that vary among the points (none: the error says it all), or,
    alone, those that differ from their defaults."""
    from kvlab.sweep.grid import run_options

    if varied is not None:
        shown = [f"{n}={v!r}" for n, v in point.items() if n in varied]
        return f" (in the point {', '.join(shown)})" if shown else ""
    specs = run_options()
    changed = [f"{n}={v!r}" for n, v in point.items() if n in specs and v != specs[n].default]
    return f" (in the point {', '.join(changed) or DEFAULTS_SHOWN})"


def estimate_seconds(points: list[Resolved], probe_requests: int = 200) -> float:
    """Roughly how long the points take on one core: a short run of the first point's setup, timed, scaled by
    each point's number of requests (an estimate: a saturated run costs more per request than a light one)."""
    from kvlab import service
    from kvlab.config.resolve import quietly

    first = points[0]
    requests = []
    sizes: dict[Any, int] = {}
    for point in points:
        wl = point.config.workload
        if wl.num_requests is not None and wl.duration is None:
            requests.append(wl.num_requests)
        else:  # a duration, or a file served whole: count what it builds
            if wl not in sizes:
                sizes[wl] = service.load(point.config).num_requests
            requests.append(sizes[wl])
    # (never more than the first point's own: a file with its own arrival times holds no more, trial 53b)
    probe = quietly({**engine_options(first.options), "num_requests": min(probe_requests, requests[0]), "duration": None})
    start = time.perf_counter()
    run = service.run(probe, [first.strategy])
    per_request = (time.perf_counter() - start) / max(1, run.workload.num_requests)
    return per_request * sum(requests)
