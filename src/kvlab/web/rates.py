"""The lab's rate section: each system's normalized latency against the request rate, and the rate at which it
breaks (the vLLM paper's Figure 12, on the lab's setup).

Nothing here simulates, searches or judges on its own: the service answers (kvlab.service.capacity). A point is
`kvlab run`'s (kvlab.sweep.point.compute), a breaking point is `kvlab capacity`'s search on its first sample
(breaking_points: bracket, then bisect, from the command's first rate to its tolerance, to the highest rate whose run
was sustained and met the paper's target, mean normalized latency < 0.1 s per token), a rate the reader picks is
judged as the search judges one (judged_at), and every point is stored in one in-memory sweep store, so the
search's probes, the curves and a picked rate share their simulations. One sample, not the command's two: the lab
shows where each system breaks on its setup, and its search runs beside the page's figures. The same setup on the
command line:

    kvlab capacity --strategy orca-max,orca-pow2,orca-oracle,vllm --model M --gpu G --workload W -n N --seed S \\
        --block-size B --cost C --json

gives the same breaking points (tests/web/test_lab_rates.py checks that).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from kvlab import defaults
from kvlab.errors import KvlabError

NICENESS = 10  # the simulations' worker process: below the server's streams and the browser (os.nice)
AXIS_OVER_CAPACITY = 1.5  # the chart's axis runs to at least this times the highest breaking point


@dataclass(frozen=True)
class RateSetup:
    """What the rate section's curves are drawn for: the lab's run options without the rate."""

    model: str
    gpu: str
    workload: str
    num_requests: int
    seed: int
    block_size: int
    cost: str

    def lists(self, systems: tuple[str, ...]) -> dict[str, list[Any]]:
        return {"strategy": list(systems), "model": [self.model], "gpu": [self.gpu], "workload": [self.workload],
                "num_requests": [self.num_requests], "seed": [self.seed], "block_size": [self.block_size],
                "cost": [self.cost]}


class RateLab:
    """The searches and points of the rate section, kept for the server's life (one store, one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runner = None
        self.searched: dict[RateSetup, dict] = {}

    def _runner(self):
        if self.runner is None:
            import kvlab
            from kvlab.sweep.grid import row_kinds
            from kvlab.sweep.runner import LocalPool, Runner
            from kvlab.sweep.store import Store

            # Worker processes, as `kvlab capacity --workers N` runs: the simulations hold no lock of the server's,
            # so the page's streams keep their frame rate while a search runs (benchmarks/bench_web_fps). One per
            # core up to one per system (each round of the searches runs one rate of each system at once), so the
            # first screen, which waits for the default setup's breaking points, is ready sooner
            # (benchmarks/bench_answers.py).
            # At a lower priority than the server and the browser beside it: a search must not cost the figures
            # their frames on a machine of few cores (bench_web_fps.py: the first figure drew 27.6 frames a second
            # while a search ran at normal priority, 37.6 without one). The workers leave when the server does.
            pool = LocalPool(min(len(self.systems()), os.cpu_count() or 1), niceness=NICENESS)
            self.runner = Runner(Store(None, row_kinds()), pool, kvlab.__version__)
        return self.runner

    @staticmethod
    def systems() -> tuple[str, ...]:
        from kvlab.paper import FIG2_SYSTEMS

        return tuple(FIG2_SYSTEMS)

    def breaking_points(self, setup: RateSetup) -> dict:
        """Each system's breaking point (its capacity under the paper's target) and the rates its search tried,
        with the normalized latency at each."""
        from kvlab.paper import PAPER_NAMES
        from kvlab.service.capacity import breaking_points
        from kvlab.strategies import STRATEGIES
        from kvlab.sweep.capacity import mark_text, parse_slo, rate_text
        from kvlab.sweep.grid import expand
        from kvlab.sweep.slo import DEFAULT_SLO

        with self.lock:
            if setup in self.searched:
                return self.searched[setup]
            systems = self.systems()
            configurations = expand(setup.lists(systems))
            slo = parse_slo(DEFAULT_SLO)
            searches = breaking_points(configurations, self._runner(), slo,
                                       [defaults.CAPACITY_FIRST_RATE] * len(systems))
            lines = []
            for name, search in zip(systems, searches):
                if search.error is not None:
                    raise KvlabError(f"{name} could not be simulated on this setup: {search.error}")
                found = search.to_json()
                strategy = STRATEGIES[name]
                lines.append({"name": name, "paper_name": PAPER_NAMES.get(name, name),
                              "batching": strategy.batching, "allocator": strategy.allocator,
                              "capacity_rps": found["capacity_rps"], "lower_bound": found["lower_bound"],
                              "capacity_text": mark_text(search.mark, rate_text(search.capacity)),
                              "limited_by": found["limited_by"],
                              "points": sorted(({"rate": p["rate"], "value": p["value"], "held": p["held"],
                                                 "reason": p["reason"]} for p in found["probes"]),
                                               key=lambda p: p["rate"])})
            # The chart reaches past the highest breaking point, every rate the searches tried, and the rate the
            # lab opens at (kvlab.defaults.RATE), so that the first figure's rate is on it.
            top = max(AXIS_OVER_CAPACITY * max(line["capacity_rps"] for line in lines), defaults.RATE,
                      *(p["rate"] for line in lines for p in line["points"]))
            answer = {"setup": setup.__dict__, "slo": slo.text, "slo_s": slo.terms[0].limit_s,
                      "metric": "mean normalized latency (s per output token)",
                      "axis_rps": nice_ceiling(top), "systems": lines,
                      "lesson_rate": lesson_rate(lines), "evictions": self._evictions(setup, lines)}
            self.searched[setup] = answer
            return answer

    def _evictions(self, setup: RateSetup, lines: list[dict]) -> dict | None:
        """Section 5's run: pages at their breaking point, with the evictions the engine made there (the search's
        own run of that rate, from the store)."""
        rate = evictions_rate(lines)
        if rate is None:
            return None
        name = next(line["name"] for line in lines if (line["batching"], line["allocator"]) == PAGES)
        from kvlab.sweep.grid import expand

        (row,) = self._runner().run([{**expand(setup.lists((name,)))[0], "rate": rate}])
        return {"rate": rate, "strategy": name, "num_preemptions": int(row["preemptions"] or 0)}

    def at(self, setup: RateSetup, rate: float) -> dict:
        """Every system at one rate: its normalized latency and whether the rate holds (sustained and on target),
        judged as the search judges."""
        from kvlab.service.capacity import judged_at
        from kvlab.sweep.capacity import parse_slo
        from kvlab.sweep.grid import expand
        from kvlab.sweep.slo import DEFAULT_SLO

        slo = parse_slo(DEFAULT_SLO)
        with self.lock:
            judged = judged_at(expand(setup.lists(self.systems())), self._runner(), slo, rate)
        out = []
        for name, (row, verdict) in zip(self.systems(), judged):
            if verdict is None:
                raise KvlabError(f"{name} at {rate:g} req/s could not be simulated: {row['error']}")
            out.append({"name": name, "value": slo.value(verdict), "held": verdict.held, "reason": verdict.reason})
        return {"rate": rate, "systems": out}


RESERVE_MAX, PAGES = ("continuous", "max"), ("continuous", "paged")  # the first figure's two caches


def lesson_rate(lines: list[dict]) -> float | None:
    """The rate the lab opens at: one where the lesson shows without thrashing, past where reserving the max breaks
    and short of where pages break (halfway between the two breaking points, to two significant digits); None when
    there is no such rate."""
    from kvlab.sweep.capacity import round_rate

    by_memory = {(line["batching"], line["allocator"]): line["capacity_rps"] for line in lines}
    reserve, pages = by_memory.get(RESERVE_MAX), by_memory.get(PAGES)
    if not reserve or not pages or pages <= reserve:
        return None
    return float(f"{round_rate((reserve + pages) / 2):.2g}")


def evictions_rate(lines: list[dict]) -> float | None:
    """The rate section 5 runs pages at, so that they run out on purpose: their breaking point, the highest rate
    they keep up with, where their cache is full most of the time and an answer that grows finds no free block.
    None when pages kept up at no rate the search tried."""
    pages = next((line for line in lines if (line["batching"], line["allocator"]) == PAGES), None)
    return pages["capacity_rps"] if pages and pages["capacity_rps"] else None


def nice_ceiling(value: float) -> float:
    """``value`` rounded up to two significant digits (3.938 -> 4.0): the chart's end."""
    import math

    step = 10 ** (math.floor(math.log10(value)) - 1)
    return round(math.ceil(value / step - 1e-9) * step, 6)

