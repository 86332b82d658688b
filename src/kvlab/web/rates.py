"""The lab's rate section: each system's normalized latency against the request rate, and the rate at which it
breaks (the vLLM paper's Figure 12, on the lab's setup).

Nothing here simulates, searches or judges on its own: the service answers (kvlab.service.capacity). A point is
`kvlab run`'s (kvlab.sweep.point.compute), a breaking point is `kvlab capacity`'s answer, searched by the same call
(capacities: on the setup's requests and a second, longer sample, each bracketed, then bisected, from the command's
first rate to its tolerance, to the highest rate whose run was sustained and met the paper's target, mean normalized
latency < 0.1 s per token; the answer the lower sample's, answering), a rate the reader picks is judged as the search
judges one (judged_at), and every point is stored in one in-memory sweep store, so the search's probes, the curves
and a picked rate share their simulations. The first screen asks for the breaking points of the two systems its
opening rates are read from (RateLab.opening_systems: reserving the max and pages), section 7 later for all four:
each system's search is kept, so the second request searches the other two only. The same setup on the command line:

    kvlab capacity --strategy orca-max,orca-pow2,orca-oracle,vllm --model M --gpu G --workload W -n N --seed S \\
        --block-size B --cost C --json

gives the same breaking points (tests/test_lab_rates_cli.py and tests/web/test_lab_rates.py check that; trial 54,
finding 4: the lab searched the first sample alone, and could answer higher than the command).
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
        self.lines: dict[tuple[RateSetup, str], dict] = {}  # each system's search, once found
        self.searched: dict[tuple[RateSetup, tuple[str, ...]], dict] = {}  # each answer, once given
        self.answered: dict[tuple[RateSetup, str], dict] = {}  # each system's configuration whose sample answered

    def _runner(self):
        if self.runner is None:
            import kvlab
            from kvlab.sweep.grid import row_kinds
            from kvlab.sweep.runner import LocalPool, Runner
            from kvlab.sweep.store import Store

            # Worker processes, as `kvlab capacity --workers N` runs: the simulations hold no lock of the server's,
            # so the page's streams keep their frame rate while a search runs (benchmarks/bench_web_fps). One per
            # core up to one per system (each round of the searches runs one rate of each system at once), so the
            # first screen, which waits for the breaking points of the default setup's opening systems, is ready
            # sooner (benchmarks/bench_answers.py).
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

    @staticmethod
    def opening_systems() -> tuple[str, ...]:
        """The systems the first screen waits for: the first figure's two caches, reserving the max and pages
        (lesson_rate reads their breaking points, evictions_rate pages'), in systems()' order."""
        from kvlab.strategies import STRATEGIES

        return tuple(name for name in RateLab.systems()
                     if (STRATEGIES[name].batching, STRATEGIES[name].allocator) in (RESERVE_MAX, PAGES))

    def axis_rps(self, setup: RateSetup) -> float | None:
        """The chart's end for ``setup`` where its breaking points are known already, else None (not searched)."""
        answer = self.searched.get((setup, self.systems()))
        return None if answer is None else answer["axis_rps"]

    def breaking_points(self, setup: RateSetup, systems: tuple[str, ...] | None = None) -> dict:
        """Each system's breaking point (its capacity under the paper's target) and the rates its search tried,
        with the normalized latency at each: of ``systems`` (names of ``systems()``, in that order; None: all).

        Each system's search is kept once found (one per setup and system), so a later request for more systems
        searches only those not yet searched: the first screen asks for its two (opening_systems), section 7 for
        all four, and nothing is searched or simulated twice. A system's search depends on its own runs only, so
        its breaking point is the same whichever systems are asked with it (tests/web/test_lab_rates.py)."""
        systems = self.systems() if systems is None else systems
        answer = self.searched.get((setup, systems))
        if answer is not None:
            return answer  # (without the lock: the first screen's two, given while section 7's other two are searched)
        with self.lock:
            if (setup, systems) in self.searched:
                return self.searched[(setup, systems)]
            self._search(setup, tuple(name for name in systems if (setup, name) not in self.lines))
            lines = [self.lines[(setup, name)] for name in systems]
            from kvlab.sweep.capacity import parse_slo
            from kvlab.sweep.slo import DEFAULT_SLO

            slo = parse_slo(DEFAULT_SLO)
            # The chart reaches past the highest breaking point, every rate the searches tried, and the rate the
            # lab opens at (kvlab.defaults.RATE), so that the first figure's rate is on it.
            top = max(AXIS_OVER_CAPACITY * max(line["capacity_rps"] or 0 for line in lines), defaults.RATE,
                      *(p["rate"] for line in lines for p in line["points"]))
            answer = {"setup": setup.__dict__, "slo": slo.text, "slo_s": slo.terms[0].limit_s,
                      "metric": "mean normalized latency (s per output token)",
                      "axis_rps": nice_ceiling(top), "systems": lines,
                      "lesson_rate": lesson_rate(lines), "evictions": self._evictions(setup, lines),
                      "samples_note": SAMPLES_NOTE}
            self.searched[(setup, systems)] = answer
            return answer

    def _search(self, setup: RateSetup, systems: tuple[str, ...]) -> None:
        """Search ``systems``' breaking points on ``setup`` as `kvlab capacity` searches them, on its two samples
        (kvlab.service.capacity.capacities, one round of the searches running one rate of each at once), and keep
        each system's line (self.lines): its answer, the lower sample's (answering)."""
        if not systems:
            return
        from kvlab.paper import PAPER_NAMES
        from kvlab.service.capacity import answering, capacities, longer_samples
        from kvlab.strategies import STRATEGIES
        from kvlab.sweep.capacity import parse_slo
        from kvlab.sweep.grid import expand
        from kvlab.sweep.slo import DEFAULT_SLO

        configurations = expand(setup.lists(systems))
        longer, _ = longer_samples(configurations, defaults.CAPACITY_FIRST_RATE)  # (none: the first alone answers)
        every, _ = capacities(configurations, longer, self._runner(), parse_slo(DEFAULT_SLO),
                              defaults.CAPACITY_FIRST_RATE)
        firsts, seconds = every[:len(systems)], every[len(systems):] or [None] * len(systems)
        for name, search in zip(systems, every):
            if search.error is not None:
                raise KvlabError(f"{name} could not be simulated on this setup: {search.error}")
        searches = [answering(first, second) for first, second in zip(firsts, seconds)]
        for i, (name, search) in enumerate(zip(systems, searches)):  # (the sample that answered: section 5's run)
            self.answered[(setup, name)] = configurations[i] if search is firsts[i] else longer[i]
        for name, search in zip(systems, searches):
            found = search.to_json()
            strategy = STRATEGIES[name]
            self.lines[(setup, name)] = {
                "name": name, "paper_name": PAPER_NAMES.get(name, name),
                "batching": strategy.batching, "allocator": strategy.allocator,
                "capacity_rps": found["capacity_rps"], "lower_bound": found["lower_bound"],
                "capacity_text": found["capacity_text"],
                # (why "none (3.25 ?)" or "≥ 2.5", as kvlab capacity says it; the rate a too short run held: trial 53,
                # finding 2)
                "uncertified_reason": found["uncertified_reason"], "uncertified_rps": found["uncertified_rps"],
                "limited_by": found["limited_by"],
                "points": sorted(({"rate": p["rate"], "value": p["value"], "held": p["held"],
                                   "reason": p["reason"]} for p in found["probes"]), key=lambda p: p["rate"])}

    def _evictions(self, setup: RateSetup, lines: list[dict]) -> dict | None:
        """Section 5's run: pages at their breaking point, with the evictions the engine made there (the search's
        own run of that rate, from the store)."""
        rate = evictions_rate(lines)
        if rate is None:
            return None
        name = next(line["name"] for line in lines if (line["batching"], line["allocator"]) == PAGES)
        (row,) = self._runner().run([{**self.answered[(setup, name)], "rate": rate}])
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

# What a breaking point is searched on: as `kvlab capacity` searches it, two samples (trial 53, finding 2: the lab
# once searched the first alone and answered 3.25 where the command answered 2.5 req/s; trial 54, finding 4).
SAMPLES_NOTE = ("each breaking point is searched as kvlab capacity searches it, on these requests and on a second, "
                "longer sample (twice the requests), and is the lower of the two: the command's answer")


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

