"""Simulations on one clock, turned into frames: what the lab's grid, its race and the --html export replay.

A ``Race`` holds one or more kvlab Simulations of the same workload and moves them together: ``advance(dt)``
runs each until the shared clock, ``step()`` runs one engine iteration of whichever is furthest behind.
``frame()`` reads each simulation's block snapshot, slot usage and counters, and encodes them (frames.py).
When every simulation is done, the frame carries the finish line: each strategy's summary (the entry
``kvlab race --json`` prints) and a sentence saying who served the most and why.

The server wraps a Race in a Session (a compute budget and a lock); the export records a Race's frames.
"""

from __future__ import annotations

import threading
import time

from kvlab.errors import KvlabError
from kvlab.service.verdict import tied, winner
from kvlab.web import annotate
from kvlab.web.cost_curve import batch_cost_curve
from kvlab.web.frames import (
    BlockEncoder,
    aggregate_columns,
    counters_dict,
    max_unfilled_slots_per_owner,
    snapshot_columns,
    usage_dict,
)

# Pools of more blocks than this are sent as display blocks of k blocks each (k the smallest that fits): the page
# could not draw more squares than this legibly anyway, and a frame stays small.
MAX_DISPLAY_BLOCKS = 16384
MAX_UNSCALED_BLOCKS = 65536


def display_scale(num_gpu_blocks: int) -> int:
    """Blocks per display block: 1 up to MAX_UNSCALED_BLOCKS, else what brings the pool to MAX_DISPLAY_BLOCKS."""
    return 1 if num_gpu_blocks <= MAX_UNSCALED_BLOCKS else -(-num_gpu_blocks // MAX_DISPLAY_BLOCKS)


class Race:
    """``setup``: what the runs were made from (the page's settings, resolved), the same for every grid; two runs
    are compared only if their setups are equal (``setup_key``)."""

    def __init__(self, simulations: list, names: list[str] | None = None, setup: dict | None = None):
        if not simulations:
            raise KvlabError("a race needs at least one strategy")
        self.sims = list(simulations)
        self.names = names or [sim.strategy.name for sim in self.sims]
        self.setup = setup or {}
        self.encoders = [BlockEncoder() for _ in self.sims]
        self.start_time = min(sim.start_time for sim in self.sims)
        cfg = self.sims[0].config
        self.num_gpu_blocks = cfg.cache.num_gpu_blocks
        self.block_size = cfg.cache.block_size
        self.scale = display_scale(self.num_gpu_blocks)
        # Per grid: the ids the engine evicted since the last frame (from its SchedulerOutputs), in order.
        self.evicted: list[list[int]] = [[] for _ in self.sims]
        self.follow: int | None = None  # the conversation whose block table each frame carries
        self.finish_times: list[float | None] = [None] * len(self.sims)
        self.clock = self.start_time
        self.seq = -1
        self.max_unfilled = [0] * len(self.sims)
        self._results: list | None = None
        self._summaries: list[dict] | None = None
        self._curves: list | None = None
        # Per grid: the (step, clock) it was last drawn at, and that grid's frame entry; a simulation that has
        # not moved (finished, or waiting for its next arrival) is not read again.
        self._last: list[tuple | None] = [None] * len(self.sims)
        self._last_entry: list[dict | None] = [None] * len(self.sims)

    @property
    def done(self) -> bool:
        return all(sim.done for sim in self.sims)

    @property
    def num_blocks(self) -> int:
        """Display blocks per grid (the pool's blocks, or groups of ``scale`` of them)."""
        return -(-self.num_gpu_blocks // self.scale)

    def advance(self, dt: float) -> None:
        """Move the shared clock ``dt`` simulated seconds on; each simulation runs until it gets there."""
        self.advance_to(self.clock + dt)

    def advance_to(self, target: float) -> None:
        """Move the shared clock to ``target`` (the simulations' own clock, not time since the start); each
        simulation runs until it gets there. A frame taken after it is the same whatever path led there."""
        for i, sim in enumerate(self.sims):
            if not sim.done:
                self._ran(i, sim.run_until(target))
        self.clock = target if not self.done else max(self.clock, max(sim.now for sim in self.sims))

    def _ran(self, i: int, outputs) -> None:
        for out in outputs:
            if out is not None and out.preempted_req_ids:
                self.evicted[i].extend(out.preempted_req_ids)

    def step(self) -> None:
        """One engine iteration of the simulation(s) furthest behind, so that all stay on one clock."""
        behind = [sim for sim in self.sims if not sim.done]
        if not behind:
            return
        earliest = min(sim.now for sim in behind)
        for i, sim in enumerate(self.sims):
            if not sim.done and sim.now <= earliest:
                self._ran(i, [sim.step()])
        still = [sim.now for sim in self.sims if not sim.done]
        self.clock = max(self.clock, min(still) if still else max(sim.now for sim in self.sims))

    @property
    def t(self) -> float:
        """Where the run is: simulated seconds since the first arrival, to the millisecond (as refusals say it)."""
        return round(self.clock - self.start_time, 3)

    def seek(self, t: float, deadline: float | None = None, budget_s: float | None = None) -> None:
        """Run on until ``t`` seconds after the first arrival; a time before where the run is already is refused
        (a seek never goes back). ``deadline`` (time.monotonic()) bounds the wall time, as run_to_end's does."""
        if t < self.t:
            raise KvlabError(f"t {t:g} is before where the run is already (t={self.t:g} s): a seek runs on, never "
                             f"back; valid: t of at least {self.t:g}, or start the run again")
        target = self.start_time + t
        while self.clock < target and not self.done:
            if deadline is not None and time.monotonic() >= deadline:
                raise self._over_budget(f"get to t={t:g} s", budget_s)
            self.advance_to(min(target, self.clock + 10.0))

    def run_to_end(self, deadline: float | None = None, budget_s: float | None = None) -> None:
        """Run every simulation to the end; ``deadline`` (time.monotonic()) bounds the wall time, ``budget_s`` the
        compute it stands for (named in the refusal)."""
        while not self.done:
            if deadline is not None and time.monotonic() >= deadline:
                raise self._over_budget("finish", budget_s)
            self.advance(10.0)
            # A run jumped to its end is still looked at every 10 simulated seconds, for the most memory one
            # conversation held without tokens (the second question reads it); not a pool drawn at a display
            # scale, whose snapshots cost more than the run.
            for i, sim in enumerate(self.sims):
                if not sim.done and self.scale == 1:
                    cols = snapshot_columns(sim.snapshot())
                    self.max_unfilled[i] = max(self.max_unfilled[i], max_unfilled_slots_per_owner(cols))

    def _over_budget(self, what: str, budget_s: float | None) -> KvlabError:
        budget = "time budget" if budget_s is None else (
            f"{budget_s:g} s of computing (wall-clock time the server spends on the run, over its whole life)")
        return KvlabError(f"the run did not {what} within its {budget}: it stopped at t={self.t:g} s of simulated "
                          "time; make it smaller (fewer requests)")

    def frame(self, have: int | None = None) -> dict:
        """The next frame. A delta if the client's last applied frame (``have``) is the last one encoded,
        otherwise a key frame (a new client, or a stream closed before its last frame arrived)."""
        key = have is None or have != self.seq
        self.seq += 1
        grids = []
        for i, sim in enumerate(self.sims):
            moved = (sim.scheduler.step, sim.now)
            if not key and self._last[i] == moved and self.follow == self._last_entry[i].get("following"):
                last = self._last_entry[i]
                grids.append({**last, "note": {**last["note"], "evicted": []},
                              "blocks": {"key": False, "n": 0, "data": ""}})
                continue
            self._last[i] = moved
            self._last_entry[i] = entry = self._entry(i, sim, key)
            grids.append(entry)
        out = {"seq": self.seq, "t": self.clock - self.start_time, "done": self.done, "grids": grids}
        if out["done"]:
            out["finish"] = self.finish_line()
        return out

    def _entry(self, i: int, sim, key: bool) -> dict:
        cols = snapshot_columns(sim.snapshot())
        usage = sim.slot_usage()
        self.max_unfilled[i] = max(self.max_unfilled[i], max_unfilled_slots_per_owner(cols))
        raw = sim.counters_now()
        counters = counters_dict(raw, usage)
        counters["max_unfilled_per_request"] = self.max_unfilled[i]
        if sim.done and self.finish_times[i] is None:
            self.finish_times[i] = sim.now - self.start_time
        evicted, self.evicted[i] = self.evicted[i], []
        entry = {
            "counters": counters,
            "usage": usage_dict(usage),
            "done": sim.done,
            "finish_time": self.finish_times[i],
            "note": annotate.note(sim, cols, evicted, self.block_size),
            "blocks": self.encoders[i].encode_columns(aggregate_columns(cols, self.scale), key=key),
            "following": self.follow,
        }
        if self.follow is not None:
            entry["table"] = annotate.block_table(sim, self.follow, self.block_size)
        return entry

    def results(self) -> list:
        """Each simulation's result as its clients saw it (the run service's: a profile's request latency in)."""
        from kvlab import service

        if self._results is None:
            self._results = [service.finish(sim) for sim in self.sims]
        return self._results

    def summaries(self) -> list[dict]:
        if self._summaries is None:
            self._summaries = [r.summary() for r in self.results()]
        return self._summaries

    def finish_line(self) -> dict:
        summaries = self.summaries()
        return {"summaries": summaries, "winner": winner(summaries), "verdict": verdict(summaries),
                "finished_over_time": self.finish_curves()}

    def finish_curves(self, num_points: int = 200) -> list[list[list[float]]]:
        """Per strategy, [time, requests finished by then] at up to ``num_points`` points: the finish line's
        chart, from each request's own finish time (so a run jumped to its end draws as it happened)."""
        if self._curves is None:
            self._curves = []
            for result in self.results():
                times = sorted(r.finish_time - self.start_time for r in result.records
                               if r.finish_time is not None)
                n = len(times)
                picks = sorted({max(1, round(j * n / num_points)) for j in range(1, num_points + 1)}) if n else []
                self._curves.append([[0.0, 0]] + [[round(times[c - 1], 4), c] for c in picks])
        return self._curves

    def meta(self) -> dict:
        """What the page needs once per run: the grids' shape, the strategies, and the requests (for hover)."""
        first = self.sims[0]
        cfg = first.config
        return {
            "setup": self.setup,
            "setup_key": setup_key(self.setup),
            "cost_curve": batch_cost_curve(cfg.cost, first.requests, cfg.scheduler.max_num_seqs),
            "num_blocks": self.num_blocks,  # display blocks, of block_size x display_scale slots each
            "display_scale": self.scale,
            "num_gpu_blocks": self.num_gpu_blocks,
            "kv_block_size": cfg.cache.block_size,
            "kv_bytes_per_token": cfg.cache.kv_bytes_per_token,
            "max_num_seqs": cfg.scheduler.max_num_seqs,
            "block_size": cfg.cache.block_size * self.scale,
            "num_slots": cfg.cache.num_slots,
            "max_model_len": cfg.scheduler.max_model_len,
            "model": cfg.model.model,
            "gpu": cfg.gpu,
            "workload": first.workload.name,
            "workload_description": first.workload.description,
            "grids": [
                {
                    "name": name,
                    "batching": sim.strategy.batching,
                    "allocator": sim.strategy.allocator,
                    "description": sim.strategy.description,
                    "block_size": cfg.cache.block_size,
                }
                for name, sim in zip(self.names, self.sims)
            ],
            # [request_id, arrival (s), prompt_len, answer length], in the hover's words.
            "requests": [
                [r.request_id, round(r.arrival_time - self.start_time, 3), r.prompt_len, r.num_output_tokens]
                for r in first.requests
            ],
        }


def setup_of(spec, config) -> dict:
    """What a run was made from besides its strategy: the page's settings, with what they resolved to (the
    pool's blocks, the seats, the longest context). Runs are compared only when these are equal."""
    return {
        "model": spec.model, "gpu": spec.gpu, "workload": spec.workload, "rate": spec.rate,
        "num_requests": spec.num_requests, "seed": spec.seed, "block_size": spec.block_size,
        "num_gpu_blocks": config.cache.num_gpu_blocks, "max_num_seqs": config.scheduler.max_num_seqs,
        "max_model_len": config.scheduler.max_model_len, "cost": spec.cost,
    }


def setup_key(setup: dict) -> str:
    """The resolved configuration's own key (kvlab.config.KvlabConfig.key) when the setup carries it."""
    return setup.get("key") or "|".join(f"{k}={setup[k]}" for k in sorted(setup))


def verdict(summaries: list[dict]) -> str:
    """The finish line's sentence: who served the most and why, from the summaries alone; a tie is said as one."""
    if len(summaries) > 1 and winner(summaries) is None:
        names = tied(summaries)
        top = [s for s in summaries if s["name"] in names]
        first = top[0]
        same = all(s["makespan_s"] == first["makespan_s"] and s["preemptions"] == first["preemptions"] for s in top)
        text = (f"{_and(names)} tied: each served {first['throughput_rps']:.2f} requests/s"
                + (f", all {first['num_finished']:,} in {first['makespan_s']:.1f} s" if same else "") + ".")
        rest = [s for s in summaries if s["name"] not in names]
        if rest:
            worst = min(rest, key=lambda s: (s["throughput_rps"], s["name"]))
            text += f" {worst['name']} served the fewest: {worst['throughput_rps']:.2f} requests/s."
        if same:
            text += " Same throughput, same finish time, same evictions: nothing separates them."
        return text
    if len(summaries) == 1:
        s = summaries[0]
        return (
            f"{s['name']} served {s['num_finished']:,} requests in {s['makespan_s']:.1f} s "
            f"({s['throughput_rps']:.2f} requests/s) with {s['memory_shares']['token']:.1f}% of its memory "
            f"holding tokens and {s['mean_batch_size']:.1f} requests per iteration on average."
        )
    best = next(s for s in summaries if s["name"] == winner(summaries))
    worst = min(summaries, key=lambda s: (s["throughput_rps"], s["name"]))
    text = (
        f"{best['name']} served the most: {best['throughput_rps']:.2f} requests/s, all {best['num_finished']:,} "
        f"served in {best['makespan_s']:.1f} s, against {worst['throughput_rps']:.2f} requests/s for "
        f"{worst['name']} ({worst['makespan_s']:.1f} s). "
    )
    b_tok, w_tok = best["memory_shares"]["token"], worst["memory_shares"]["token"]
    b_batch, w_batch = best["mean_batch_size"], worst["mean_batch_size"]
    if b_batch > w_batch:
        text += (
            f"Why: {b_tok:.0f}% of its memory held tokens against {w_tok:.0f}%, so it ran "
            f"{b_batch:.1f} requests per iteration on average against {w_batch:.1f}."
        )
    else:
        text += (f"Its memory held {b_tok:.0f}% tokens against {w_tok:.0f}%; it batched {b_batch:.1f} requests "
                 "on average.")
    if best["preemptions"]:
        text += (
            f" It evicted {best['preemptions']:,} times (when its pages ran out mid-answer, the newest "
            f"conversation went back to the queue, to be computed again: {best['recomputed_tokens']:,} tokens in "
            f"all), and still served the most."
        )
    return text


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class Session:
    """A Race the server keeps for one page: a lock (requests may overlap), and a compute budget."""

    def __init__(self, race: Race, spec, max_compute_seconds: float):
        self.race = race
        self.spec = spec
        self.max_compute_seconds = max_compute_seconds
        self.compute_seconds = 0.0
        self.last_used = time.monotonic()
        self.lock = threading.Lock()
        self.stream_id = 0  # the newest stream; an older one stops at its next frame

    def advance(self, dt: float, have: int | None, hold: float | None = None) -> dict:
        """``dt`` simulated seconds on; with ``hold``, never past ``hold`` seconds after the first arrival, and
        the frame that reaches it says so (``held``: the stream that asked for it ends there)."""
        if hold is None:
            return self._run(lambda: self.race.advance(dt), have)
        race = self.race
        target = min(race.clock + dt, race.start_time + hold)
        frame = self._run(lambda: race.advance_to(max(race.clock, target)), have)
        if race.clock >= race.start_time + hold and not frame["done"]:
            frame["held"] = True
        return frame

    def follow(self, request_id: int | None) -> dict:
        """From the next frame on, every frame carries ``request_id``'s block table (None: no table). Returns the
        tables as they stand now, which are the last frame's when nothing has run since (no frame is spent, so a
        stream playing meanwhile keeps its order)."""
        with self.lock:
            race = self.race
            if request_id is not None:
                ids = [r.request_id for r in race.sims[0].requests]
                if request_id not in ids:  # (one that will never arrive: no table would ever fill)
                    low, high = min(ids, default=0), max(ids, default=0)
                    raise KvlabError(f"id {request_id} is not a request of this run: its requests are ids {low} "
                                     f"to {high}")
            race.follow = request_id
            self.last_used = time.monotonic()
            tables = None if request_id is None else [
                annotate.block_table(sim, request_id, race.block_size) for sim in race.sims]
            return {"seq": race.seq, "tables": tables}

    def step(self, have: int | None) -> dict:
        return self._run(self.race.step, have)

    def finish(self, have: int | None) -> dict:
        remaining = max(0.0, self.max_compute_seconds - self.compute_seconds)
        return self._run(lambda: self.race.run_to_end(time.monotonic() + remaining, self.max_compute_seconds), have)

    def seek(self, t: float, have: int | None) -> dict:
        remaining = max(0.0, self.max_compute_seconds - self.compute_seconds)
        return self._run(lambda: self.race.seek(t, time.monotonic() + remaining, self.max_compute_seconds), have)

    def frame(self, have: int | None) -> dict:
        return self._run(lambda: None, have)

    def _run(self, work, have: int | None) -> dict:
        with self.lock:
            if self.compute_seconds > self.max_compute_seconds:
                raise KvlabError(
                    f"this run has used its {self.max_compute_seconds:.0f} s of computing (wall-clock time the server "
                    "spent on it); reset to start a new one"
                )
            t0 = time.monotonic()
            try:
                work()
                return self.race.frame(have)
            finally:
                self.compute_seconds += time.monotonic() - t0
                self.last_used = time.monotonic()
