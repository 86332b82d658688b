"""One point of a sweep: its options into a simulation, and the simulation's summary out.

A point's options are `kvlab run`'s: they become a ``SimConfig``, a workload and a strategy exactly as `kvlab run`
makes them (kvlab.cli.sim's ``engine_options`` and ``build_workload``); everything else in kvlab.sweep handles points
as plain mappings. It runs in worker processes (local or on a Ray cluster) and returns plain data.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any


def config_options(point: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``SimConfig.from_options`` for this point, as `kvlab run` passes them."""
    from kvlab.cli.sim import engine_options

    return engine_options(point)


def check_config(point: dict[str, Any]) -> None:
    """Raise the KvlabError `kvlab run` would raise for this point's engine options, without simulating."""
    from kvlab.sim import SimConfig

    SimConfig.from_options(**config_options(point))


def build_workload(point: dict[str, Any]):
    from kvlab.cli.sim import build_workload as cli_build_workload

    return cli_build_workload(point["workload"], point["rate"], point["arrival"], point["cv"], point["num_requests"],
                              point["duration"], point["seed"], None, point.get("long_requests", "reject"))


def simulate_point(point: dict[str, Any]) -> dict[str, Any]:
    """The summary `kvlab run --json` prints for this point (its ``strategies[0]`` entry, without the
    typical-iteration explanation)."""
    from kvlab.cli.sim import simulate

    _, _, results = simulate([point["strategy"]], quiet=True, **{k: v for k, v in point.items() if k != "strategy"})
    return results[0].summary()


def compute(point: dict[str, Any]) -> dict[str, Any]:
    """Run one point in a worker: its summary, or the error that stopped it (a failed point never stops the
    sweep), with the time it took, who computed it, and that worker's kvlab version."""
    import kvlab

    start, start_cpu = time.perf_counter(), time.process_time()
    summary, error = None, None
    try:
        summary = simulate_point(point)
    except Exception as exc:  # noqa: BLE001  (stored with the point and shown; the sweep goes on)
        error = f"{type(exc).__name__}: {exc}"
    return {
        "summary": summary,
        "error": error,
        "elapsed_s": time.perf_counter() - start,
        "cpu_s": time.process_time() - start_cpu,  # beside elapsed_s: how much of the wall time this worker ran
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "kvlab_version": kvlab.__version__,
    }


def check_points(points: list[dict[str, Any]]) -> None:
    """Raise the first KvlabError `kvlab run` would raise for any point, naming the point, before anything runs.
    Each distinct strategy, engine configuration and workload is built once."""
    from kvlab.cli.sim import WORKLOAD_OPTIONS
    from kvlab.errors import KvlabError
    from kvlab.strategies import parse_strategy

    seen: set[tuple] = set()
    for point in points:
        parts = (("strategy", lambda p: parse_strategy(p["strategy"]), ("strategy",)),
                 ("engine", check_config, tuple(n for n in point if n != "strategy" and n not in WORKLOAD_OPTIONS)),
                 ("workload", build_workload, WORKLOAD_OPTIONS))
        for what, check, names in parts:
            key = (what, *(repr(point[n]) for n in names))
            if key in seen:
                continue
            seen.add(key)
            try:
                check(point)
            except KvlabError as exc:
                raise KvlabError(f"{exc} (in the point {_shown(point, names)})") from None


def _shown(point: dict[str, Any], names) -> str:
    """The point's options among ``names`` that differ from `kvlab run`'s defaults: what to look at."""
    from kvlab.sweep.grid import run_options

    specs = run_options()
    changed = [f"{n}={point[n]!r}" for n in names if n in specs and point[n] != specs[n].default]
    return ", ".join(changed) or "with `kvlab run`'s defaults"


def estimate_seconds(points: list[dict[str, Any]], probe_requests: int = 200) -> float:
    """Roughly how long the points take on one core: a short run of the first point's setup, timed, scaled by
    each point's number of requests (an estimate: a saturated run costs more per request than a light one)."""
    first = points[0]
    probe = {**first, "num_requests": probe_requests, "duration": None}
    num_probe_requests = build_workload(probe).num_requests
    start = time.perf_counter()
    simulate_point(probe)
    per_request = (time.perf_counter() - start) / max(1, num_probe_requests)
    total_requests = 0
    for point in points:
        if point["num_requests"] is not None and point["duration"] is None:
            total_requests += point["num_requests"]
        else:  # a duration, or the workload's default length
            total_requests += build_workload(point).num_requests
    return per_request * total_requests
