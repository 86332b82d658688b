"""Aggregated or disaggregated: which holds an offered rate under a latency target with fewer GPUs
(`kvlab capacity --replicas auto --prefill-replicas auto --rate R --slo ...`; docs/disaggregation.md).

    n = 1, 2, ... replicas (each TP x PP GPUs), up to max_replicas:
        n aggregated replicas behind the router                  ──┐ each a sweep point on the session's runner
        every xPyD with x + y = n (1P(n-1)D, ..., (n-1)P1D)      ──┘ (stored: a comparison run again, or resumed
                                                                    after Ctrl-C, reads them), judged as capacity
                                                                    judges a rate: sustained over its measured
                                                                    window, the SLO met
    stop at the first n at which either holds: the answer is what held there (both, when both did)

Each fleet is judged on two samples, as the replica search judges a count (kvlab.service.replicas: the workload,
by default TRAFFIC_SECONDS of the offered traffic, and a longer one: a trace whole, else twice it); a fleet holds
when it held on both, so that the answer does not move with the sample's length. A configuration that holds at n
is taken to hold with more replicas of the same kind, as the replica search assumes. Every fleet of one n is
simulated at once (a pool of workers runs them side by side).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import KvlabError

DEFAULT_MAX_REPLICAS = 8
# For --max-time's estimate (the comparison stops at the first n at which a fleet holds, so its length is not known
# before it runs): the fleets of n = 1 to 3, 1 + 2 + 3 = 6 on each sample, as a typical comparison judges.
TYPICAL_FLEETS = 6


@dataclass
class DisaggComparison:
    """The fewest replicas of each kind that held (None: none up to ``max_replicas``), every fleet tried, the GPUs
    one replica takes, and the samples' lengths (one when the trace holds no second: ``note`` says why)."""

    rate: float
    slo: str
    gpus_per_replica: int
    max_replicas: int
    aggregated: int | None = None
    disaggregated: tuple[int, int] | None = None  # (prefill, decode) replicas
    tried: list[dict[str, Any]] = field(default_factory=list)
    sample_lengths: list[int] = field(default_factory=list)
    note: str | None = None  # a sample cut to fit the trace, or why there is no second sample

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

    def next_fleets(self) -> list[tuple[int, int]]:
        """The fleets to judge next, (prefill, decode) replicas: every shape of the next count (judged at once), until
        one held at the last count judged or max_replicas were tried (then none)."""
        judged = max((r["prefill_replicas"] + r["decode_replicas"] for r in self.tried), default=0)
        if self.aggregated is not None or self.disaggregated is not None or judged >= self.max_replicas:
            return []
        return shapes(judged + 1)

    def record(self, row: dict[str, Any]) -> None:
        """One fleet's judged row (``_row``), in the order of shapes(): of one count's xPyD that held, the one with
        the fewest prefill replicas is the answer."""
        self.tried.append(row)
        if row["held"] and row["prefill_replicas"] == 0:
            self.aggregated = row["decode_replicas"]
        elif row["held"] and self.disaggregated is None:
            self.disaggregated = (row["prefill_replicas"], row["decode_replicas"])

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "slo": self.slo, "gpus_per_replica": self.gpus_per_replica,
                "max_replicas": self.max_replicas, "aggregated_replicas": self.aggregated,
                "disaggregated": None if self.disaggregated is None else
                {"prefill_replicas": self.disaggregated[0], "decode_replicas": self.disaggregated[1]},
                "answer": self.answer, "sample_lengths": self.sample_lengths, "note": self.note,
                "tried": self.tried}


def shapes(n: int) -> list[tuple[int, int]]:
    """(prefill, decode) replicas for n in all: 0 prefill is n aggregated replicas; then 1P(n-1)D, ...,
    (n-1)P1D."""
    return [(0, n), *((x, n - x) for x in range(1, n))]


def compare_fewest_gpus(point: dict[str, Any], slo, runner, *, given_length: bool = True,
                        max_replicas: int = DEFAULT_MAX_REPLICAS,
                        progress: Callable[[dict[str, Any]], None] | None = None) -> DisaggComparison:
    """The comparison for ``point`` (a sweep point: a strategy and every option, its rate the offered traffic)
    under ``slo`` (kvlab.sweep.slo.Slo), each fleet simulated on ``runner`` (kvlab.sweep.runner.Runner: what its
    store holds is read, not simulated again). ``given_length``: the point's -n or --duration is the first sample
    (else the replica search's default length)."""
    comparison, samples = prepare_comparison(point, slo, given_length=given_length, max_replicas=max_replicas)
    return run_comparison(comparison, samples, slo, runner, progress)


def prepare_comparison(point: dict[str, Any], slo, *, given_length: bool = True,
                       max_replicas: int = DEFAULT_MAX_REPLICAS) -> tuple[DisaggComparison, list[dict[str, Any]]]:
    """compare_fewest_gpus before any fleet runs: the comparison, nothing tried yet, and its samples' options (one or
    two), every setting checked; a caller estimates the work from them (TYPICAL_FLEETS) before it starts any."""
    from kvlab.config.resolve import quietly
    from kvlab.service.engine import check_disaggregated, load, strategies
    from kvlab.service.replicas import first_sample_options, second_sample_options
    from kvlab.sweep.point import engine_options

    for name in ("replicas", "prefill_replicas", "decode_replicas", "router", "router_scorers"):
        point = {k: v for k, v in point.items() if k != name}
    if point.get("rate") is None:
        raise KvlabError("--replicas auto --prefill-replicas auto compares the GPUs two kinds of fleet need for one "
                         "offered rate: give --rate R (req/s, the whole fleet's traffic)")
    if not 1 <= max_replicas <= 64:
        raise KvlabError(f"--max-replicas {max_replicas}: valid: a whole number from 1 to 64")
    world = quietly(engine_options(point)).parallel.world_size
    comparison = DisaggComparison(point["rate"], slo.describe, world, max_replicas)
    first, comparison.note = first_sample_options(point, given_length)
    one_each = quietly(engine_options({**first, "prefill_replicas": 1, "decode_replicas": 1}))
    check_disaggregated(one_each, strategies([first["strategy"]], one_each), load(one_each))  # (before any run)
    config = quietly(engine_options(first))
    second, no_second = second_sample_options(first, config.workload)
    samples = [first] if second is None else [first, second]
    comparison.note = comparison.note or no_second
    comparison.sample_lengths = [len(load(quietly(engine_options(options))).requests) for options in samples]
    return comparison, samples


def run_comparison(comparison: DisaggComparison, samples: list[dict[str, Any]], slo, runner,
                   progress: Callable[[dict[str, Any]], None] | None = None) -> DisaggComparison:
    """prepare_comparison's comparison judged: every fleet of n = 1, 2, ... replicas on each sample, until one holds."""
    runner.in_rounds = True  # (the progress' total: the fleets asked for so far; each size n asks for more)
    while fleets := comparison.next_fleets():
        rows = runner.run([{**options, **_fleet(prefill, decode)} for prefill, decode in fleets for options in samples])
        for i, (prefill, decode) in enumerate(fleets):
            row = _row(prefill, decode, rows[i * len(samples):(i + 1) * len(samples)], slo,
                       comparison.gpus_per_replica, comparison.sample_lengths)
            comparison.record(row)
            if progress is not None:
                progress(row)
    return comparison


def point_from_grid(lists: dict[str, list], explicit: list[dict]) -> tuple[dict[str, Any], bool]:
    """The one configuration a command line's comparison is of (its grid's lists and explicit points, --replicas
    auto and --prefill-replicas auto taken out), and whether it gives the sample's length (-n or --duration)."""
    from kvlab.sweep.grid import expand

    for name in ("prefill_replicas", "decode_replicas"):
        if lists.pop(name, ["auto"]) != ["auto"]:
            raise KvlabError(f"--replicas auto --prefill-replicas auto searches the shapes: give no "
                             f"--{name.replace('_', '-')} values")
    given_length = "num_requests" in lists or "duration" in lists or \
        any("num_requests" in p or "duration" in p for p in explicit)
    points = expand(lists, explicit)
    if len(points) != 1:
        raise KvlabError(f"--replicas auto --prefill-replicas auto compares one configuration; the grid has "
                         f"{len(points)}: give one value of each option")
    return points[0], given_length


def shape_name(prefill: int, decode: int) -> str:
    """'1 replica', '3 replicas', '1P2D'."""
    if prefill:
        return f"{prefill}P{decode}D"
    return f"{decode} replica{'s' if decode > 1 else ''}"


def _fleet(prefill: int, decode: int) -> dict[str, Any]:
    """A fleet's options: xPyD, n replicas behind the router, or one replica (it routes nothing: the router at its
    defaults, one stored point whatever the router)."""
    from kvlab.config.options import OPTIONS

    if prefill:
        return {"prefill_replicas": prefill, "decode_replicas": decode}
    if decode > 1:
        return {"replicas": decode}
    return {"router": OPTIONS["router"].default, "router_scorers": OPTIONS["router_scorers"].default}


def _row(prefill: int, decode: int, stored: list[dict[str, Any]], slo, world: int,
         lengths: list[int]) -> dict[str, Any]:
    """One fleet as a capacity search judges it, on each sample: held (on every sample), why not (the first sample
    that failed), and the first sample's p99 TTFT and TPOT."""
    import json

    from kvlab.sweep.capacity import verdict

    samples = []
    for row, length in zip(stored, lengths):
        if row["status"] != "ok":
            raise KvlabError(f"{shape_name(prefill, decode)} on {length:,} requests: {row['error']}")
        judged, _ = verdict(slo, row)
        summary = json.loads(row["summary"])
        samples.append({"num_requests": length, "held": judged.held, "reason": judged.reason,
                        "ttft_p99_s": summary["ttft_s"]["p99"], "tpot_p99_s": summary["tpot_s"]["p99"]})
    failed = next((s for s in samples if not s["held"]), None)
    reason = "" if failed is None else failed["reason"] + (
        f" (on the second sample, {failed['num_requests']:,} requests)" if failed is not samples[0] else "")
    return {"shape": shape_name(prefill, decode), "prefill_replicas": prefill, "decode_replicas": decode,
            "gpus": (prefill + decode) * world, "held": failed is None, "reason": reason,
            "ttft_p99_s": samples[0]["ttft_p99_s"], "tpot_p99_s": samples[0]["tpot_p99_s"], "samples": samples}
