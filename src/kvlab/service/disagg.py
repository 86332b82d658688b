"""Aggregated or disaggregated: which holds an offered rate under a latency target with fewer GPUs
(`kvlab capacity --replicas auto --prefill-replicas auto --rate R --slo ...`; docs/disaggregation.md).

    n = 1, 2, ... replicas (each TP x PP GPUs), up to max_replicas:
        n aggregated replicas behind the router                  ──┐ each a sweep point (kvlab.sweep.point), judged
        every xPyD with x + y = n (1P(n-1)D, ..., (n-1)P1D)      ──┘ as capacity judges a rate (verdict: sustained
                                                                    over its measured window, the SLO met)
    stop at the first n at which either holds: the answer is what held there (both, when both did)

A configuration that holds at n is taken to hold with more replicas of the same kind, as the replica search
assumes; the shapes of one n are tried in order, fewest prefill replicas first, and the first that holds is the
answer. The points are simulated one after the other here (no store, no pool).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import KvlabError

DEFAULT_MAX_REPLICAS = 8


@dataclass
class DisaggComparison:
    """The fewest replicas of each kind that held (None: none up to ``max_replicas``), every point tried, and the
    GPUs one replica takes."""

    rate: float
    slo: str
    gpus_per_replica: int
    max_replicas: int
    aggregated: int | None = None
    disaggregated: tuple[int, int] | None = None  # (prefill, decode) replicas
    tried: list[dict[str, Any]] = field(default_factory=list)

    @property
    def answer(self) -> str:
        """Which holds with fewer GPUs: "aggregated", "disaggregated", "either" (the same count), or "neither"."""
        agg = self.aggregated
        dis = sum(self.disaggregated) if self.disaggregated is not None else None
        if agg is None and dis is None:
            return "neither"
        if dis is None or (agg is not None and agg < dis):
            return "aggregated"
        if agg is None or dis < agg:
            return "disaggregated"
        return "either"

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "slo": self.slo, "gpus_per_replica": self.gpus_per_replica,
                "max_replicas": self.max_replicas, "aggregated_replicas": self.aggregated,
                "disaggregated": None if self.disaggregated is None else
                {"prefill_replicas": self.disaggregated[0], "decode_replicas": self.disaggregated[1]},
                "answer": self.answer, "tried": self.tried}


def shapes(n: int) -> list[tuple[int, int]]:
    """(prefill, decode) replicas for n in all: 0 prefill is n aggregated replicas; then 1P(n-1)D, ...,
    (n-1)P1D."""
    return [(0, n), *((x, n - x) for x in range(1, n))]


def compare_fewest_gpus(point: dict[str, Any], slo, *, max_replicas: int = DEFAULT_MAX_REPLICAS,
                        progress: Callable[[dict[str, Any]], None] | None = None) -> DisaggComparison:
    """The comparison for ``point`` (a sweep point: a strategy and every option, its rate the offered traffic)
    under ``slo`` (kvlab.sweep.slo.Slo)."""
    from kvlab.config.resolve import quietly
    from kvlab.sweep.point import engine_options

    for name in ("replicas", "prefill_replicas", "decode_replicas"):
        point = {k: v for k, v in point.items() if k != name}
    if point.get("rate") is None:
        raise KvlabError("--replicas auto --prefill-replicas auto compares the GPUs two kinds of fleet need for one "
                         "offered rate: give --rate R (req/s, the whole fleet's traffic)")
    if not 1 <= max_replicas <= 64:
        raise KvlabError(f"--max-replicas {max_replicas}: valid: a whole number from 1 to 64")
    world = quietly(engine_options(point)).parallel.world_size
    comparison = DisaggComparison(point["rate"], slo.describe, world, max_replicas)
    for n in range(1, max_replicas + 1):
        held = False
        for prefill, decode in shapes(n):
            if (comparison.aggregated is not None) if prefill == 0 else (comparison.disaggregated is not None):
                continue
            row = _judge(point, prefill, decode, slo, world)
            comparison.tried.append(row)
            if progress is not None:
                progress(row)
            if row["held"] and prefill == 0:
                comparison.aggregated = n
            elif row["held"]:
                comparison.disaggregated = (prefill, decode)
            held = held or row["held"]
        if held:
            break
    return comparison


def compare_from_grid(lists: dict[str, list], explicit: list[dict], slo, *,
                      progress: Callable[[dict[str, Any]], None] | None = None) -> DisaggComparison:
    """The comparison a command line asks for: its grid's lists and explicit points (--replicas auto and
    --prefill-replicas auto taken out) must give one configuration."""
    from kvlab.sweep.grid import expand

    for name in ("prefill_replicas", "decode_replicas"):
        if lists.pop(name, ["auto"]) != ["auto"]:
            raise KvlabError(f"--replicas auto --prefill-replicas auto searches the shapes: give no "
                             f"--{name.replace('_', '-')} values")
    points = expand(lists, explicit)
    if len(points) != 1:
        raise KvlabError(f"--replicas auto --prefill-replicas auto compares one configuration; the grid has "
                         f"{len(points)}: give one value of each option")
    return compare_fewest_gpus(points[0], slo, progress=progress)


def _judge(point: dict[str, Any], prefill: int, decode: int, slo, world: int) -> dict[str, Any]:
    """One fleet's run as a capacity search judges it: held, why not, and its p99 TTFT and TPOT."""
    from kvlab.config.options import OPTIONS
    from kvlab.sweep.capacity import verdict
    from kvlab.sweep.point import simulate_point

    if prefill:
        fleet = {"prefill_replicas": prefill, "decode_replicas": decode}
        shape = f"{prefill}P{decode}D"
    elif decode > 1:
        fleet = {"replicas": decode}
        shape = f"{decode} replicas"
    else:  # (one replica routes nothing: the router at its defaults)
        fleet = {"router": OPTIONS["router"].default, "router_scorers": OPTIONS["router_scorers"].default}
        shape = "1 replica"
    summary, latencies = simulate_point({**point, **fleet})
    judged, _ = verdict(slo, {"summary": json.dumps(summary), "window_latencies": latencies})
    return {"shape": shape, "prefill_replicas": prefill, "decode_replicas": decode,
            "gpus": (prefill + decode) * world, "held": judged.held, "reason": judged.reason,
            "ttft_p99_s": summary["ttft_s"]["p99"], "tpot_p99_s": summary["tpot_s"]["p99"]}
