"""What a run measured: per-iteration records, per-request records, and their summaries.

Every metric is defined with its formula in docs/metrics.md. In short, over iterations i with durations dt_i:

    memory share of state X   = Σ_i X_i · dt_i / Σ_i capacity · dt_i          (X: token, reserved, ...)
    mean batch size           = mean over iterations of the number of requests computed in it
    throughput                = finished requests (or their output tokens) / makespan
    TTFT                      = first_token_time − arrival_time
    TPOT                      = (finish_time − first_token_time) / (num_output_tokens − 1)
    end-to-end latency        = finish_time − arrival_time
    normalized latency        = end-to-end latency / num_output_tokens    (the vLLM paper's metric)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from struct import pack, pack_into
from typing import Any, NamedTuple

SHARE_KEYS = ("token", "reserved", "internal_fragmentation", "external_fragmentation")

ITERATION_COLUMNS = (
    "time",  # start of the iteration (s)
    "duration",  # s
    "num_seqs",  # requests computed in this iteration
    "num_running",  # requests holding KV (scheduled or not)
    "num_waiting",  # queue length
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_preemptions",
    "token",  # KV slots in each state during the iteration
    "reserved",
    "internal_fragmentation",
    "overhead",
    "free",
)


class IterationLog:
    """One row per iteration, column by column: ``columns`` maps each of ITERATION_COLUMNS to a float64 numpy
    array (a million iterations take ~100 MB). Rows come in blocks (``extend``), from ``IterationRecorder``."""

    def __init__(self) -> None:
        self._blocks: list = []  # float64 arrays of shape (len(ITERATION_COLUMNS), k), in row order
        self._num_rows = 0
        self._columns: dict | None = None

    def extend(self, block) -> None:
        """Rows at once: ``block`` is a float64 numpy array with one row per column, in ITERATION_COLUMNS order."""
        self._blocks.append(block)
        self._num_rows += block.shape[1]
        self._columns = None

    @property
    def columns(self) -> dict:
        if self._columns is None:
            import numpy as np

            if len(self._blocks) != 1:
                self._blocks = [
                    np.concatenate(self._blocks, axis=1) if self._blocks else np.empty((len(ITERATION_COLUMNS), 0))
                ]
            self._columns = dict(zip(ITERATION_COLUMNS, self._blocks[0]))
        return self._columns

    def __len__(self) -> int:
        return self._num_rows


class RunRow(NamedTuple):
    """What a run of iterations (``SchedulerOutput``) left in memory and in the queues, as the metrics need it.
    Within the run, ``token`` grows by ``num_seqs`` per iteration after the first (each of them decodes) and
    ``allocated`` and ``internal_fragmentation`` by the run's ``kv_growth`` (from the iteration each block went out),
    up to what the row holds: the counters once the run's blocks all went out (the recorder takes the growth off).
    The prefill and decode tokens are the first iteration's: in the later ones, each of the ``num_seqs`` requests
    decodes. The integral reads the first fields only (``INTEGRAL_FIELDS``); the rest are the iteration log's, and a
    recorder without a log is given only the first ones."""

    num_iterations: int
    num_seqs: int
    token: int  # slots holding computed tokens in the first iteration (as if it had computed its tokens)
    allocated: int  # slots handed out once the run's blocks all went out (its growth included)
    internal_fragmentation: int  # likewise
    overhead: int
    num_running: int
    num_waiting: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preemptions: int


# The RunRow fields that the usage integral reads, its first ones: all a recorder without a log is given (fewer ints
# to pack at a flush: ~100 instructions each compiled; benchmarks/README.md, issue 34's twenty-first step).
INTEGRAL_FIELDS = RunRow._fields[:6]


class IterationRecorder:
    """Collects runs of iterations as they come and adds them to the integral and the log in numpy passes.

    Per run, its ``RunRow`` (one array per column); per iteration, its duration; per block a run hands out, the
    iteration and the slots it adds. ``flush`` expands them to per-iteration states (``slot_usage``'s arithmetic
    over arrays) and sums state x duration left to right onto the running totals, so the floats are the same
    however the iterations were grouped into runs. Slot counts become float64 there: whole numbers far below
    2**53, so every sum and product of them is exact."""

    # Iterations kept before a flush. Not more: the pass's temporaries then outgrow what the C allocator keeps
    # mapped (at 65,536, half of a flush's time went to mapping fresh memory: benchmarks/README.md).
    BUFFER_ITERATIONS = 32768

    def __init__(self, num_slots: int, start_time: float, *, keep_log: bool) -> None:
        from array import array

        self.num_slots = num_slots
        self.start_time = start_time
        self.integral = UsageIntegral()
        self.log = IterationLog() if keep_log else None
        self._row_fields = RunRow._fields if keep_log else INTEGRAL_FIELDS  # (what ``add`` is given of each row)
        # The RunRows' fields one after another, a flat list packed into numpy at a flush (``_int64s``; an
        # array.array parses each number it takes in: twice the cost per run); every iteration's duration, an
        # array.array (a long run's come as a numpy array, copied in as bytes), the short runs' since the last long one
        # in a list (``_spill``).
        self._rows: list[int] = []
        self._durations = array("d")
        self._short_durations: list[float] = []
        # The runs' growth (DecodeRun.growth: three ints an entry), one run's after another, and each run's
        # length there (a flat list of ints is packed at a flush, ``_int64s``: flattening tuples cost twice as much).
        self._growth: list[int] = []
        self._growth_lengths: list[int] = []
        self._joined: list[int] = []  # the iteration before which a request joined the queue, one per request
        # (iteration, clock) where buffered iterations start and where they resume after the clock jumped
        # (idle until an arrival); in between, each starts when the one before ends.
        self._clock_starts: list[tuple[int, float]] = []
        self._clock_end = start_time

    def add(self, row: tuple[int, ...], durations, start: float, end: float,
            growth: tuple[int, ...] = (), joined: tuple[int, ...] = ()) -> None:
        """Record a run that began at ``start`` and ended at ``end`` (``now += dt``, left to right): ``row``, its
        ``RunRow``'s fields in their order (a plain tuple: a named tuple is one more C call per run), only the
        ``INTEGRAL_FIELDS`` when the recorder keeps no log, ``growth``
        its ``kv_growth``. ``joined``: for each request that joined the waiting queue during the run, the iteration
        (from 0) before which it did (from then on ``num_waiting`` counts it)."""
        first = len(self._durations) + len(self._short_durations)
        if not first or start != self._clock_end:
            self._clock_starts.append((first, start))
        # (extend, not +=: compiled, += is the generic in-place concat)
        self._rows.extend(row)
        self._growth.extend(growth)
        self._growth_lengths.append(len(growth))
        if joined:
            self._joined.extend(first + j for j in joined)
        if isinstance(durations, list):
            self._short_durations += durations
        else:  # a numpy array (a long run)
            self._spill()
            self._durations.frombytes(durations.tobytes())
        self._clock_end = end
        if first + len(durations) >= self.BUFFER_ITERATIONS:
            self.flush()

    def _spill(self) -> None:
        """The short runs' durations, in order, onto the array as bytes packed by ``struct`` in one call: the
        array's own ``extend`` parses each float it takes in (~500 instructions a duration compiled, 15 a request on
        ``vllm``), ``np.array`` of the list ~290 (benchmarks/README.md, issue 34's tenth step). The same C doubles
        either way."""
        short = self._short_durations
        if short:  # (pack imported once, above: an import here cost ~8k instructions a spill compiled)
            self._durations.frombytes(pack(f"{len(short)}d", *short))
            short.clear()

    def flush(self) -> None:
        """Add the buffered iterations to the integral and the log."""
        self._spill()
        if not self._durations:
            return
        import numpy as np

        dt = np.frombuffer(self._durations, dtype=np.float64).copy()
        fields = self._row_fields
        table = _int64s(self._rows).reshape(-1, len(fields))
        runs = {name: table[:, i] for i, name in enumerate(fields)}
        growth = self._growth_entries(runs)
        states = self._expand(runs, growth, len(dt))
        self._integrate(states, dt, runs)
        if self.log is not None:
            self._log_rows(states, dt, runs)
        self._rows.clear()
        self._growth.clear()
        self._growth_lengths.clear()
        self._joined.clear()
        del self._durations[:]
        self._clock_starts.clear()

    def _growth_entries(self, runs: dict) -> dict:
        """The buffered runs' growth, one array per field, with each entry's iteration counted from the buffer's
        start. (Packed into numpy from flat lists, ``_int64s``: a Python loop over the entries took about half of a
        flush's time, by py-spy's samples, and flattening tuples of tuples by C iterators twice the instructions an int.)"""
        import numpy as np

        num_entries = _int64s(self._growth_lengths) // 3
        flat = _int64s(self._growth).reshape(-1, 3)
        counts = runs["num_iterations"]
        iteration = flat[:, 0] + np.repeat(np.cumsum(counts) - counts, num_entries)
        return {"iteration": iteration, "slots": flat[:, 1], "internal": flat[:, 2]}

    def _expand(self, runs: dict, growth: dict, num: int) -> dict:
        """Each iteration's slots in the five states, from its run's row and the run's growth."""
        import numpy as np

        counts = runs["num_iterations"]
        run_ends = np.cumsum(counts)

        def expand(values):
            return np.repeat(values.astype(np.float64), counts)

        offsets = np.arange(num, dtype=np.float64) - np.repeat(run_ends - counts, counts)
        # (after a run's first iteration each of its requests decodes: num_seqs tokens more an iteration; the offset
        # is 0.0 in the first, so a one-iteration run's token is its row's)
        token = expand(runs["token"]) + expand(runs["num_seqs"]) * offsets
        where = growth["iteration"]
        allocated = _before_growth(runs["allocated"], where, growth["slots"], counts, run_ends, num)
        internal = _before_growth(runs["internal_fragmentation"], where, growth["internal"], counts, run_ends, num)
        overhead = expand(runs["overhead"])
        return {
            "token": token,
            "reserved": allocated - token - internal,
            "internal_fragmentation": internal,
            "overhead": overhead,
            "free": self.num_slots - allocated - overhead,
        }

    def _integrate(self, states: dict, dt, runs: dict) -> None:
        import numpy as np

        integral = self.integral
        names = ("token", "reserved", "internal_fragmentation", "overhead", "free")
        sums = np.empty((6, len(dt)))
        for row, name in enumerate(names):
            np.multiply(states[name], dt, out=sums[row])
        sums[5] = dt
        sums[:, 0] += [getattr(integral, name) for name in names] + [integral.busy_time]
        np.add.accumulate(sums, axis=1, out=sums)  # left to right along each row
        totals = sums[:, -1].tolist()
        for name, total in zip(names, totals):
            setattr(integral, name, total)
        integral.busy_time = totals[5]
        integral.num_iterations += len(dt)
        integral.sum_batch_size += int(runs["num_iterations"] @ runs["num_seqs"])

    def _log_rows(self, states: dict, dt, runs: dict) -> None:
        import numpy as np

        assert self.log is not None
        counts = runs["num_iterations"]
        block = np.empty((len(ITERATION_COLUMNS), len(dt)))
        # time: the clock at each iteration's start, as `now += dt` advanced it from each clock start.
        times = block[0]
        times[1:] = dt[:-1]
        starts = self._clock_starts
        times[[i for i, _ in starts]] = [t for _, t in starts]
        bounds = [i for i, _ in starts] + [len(dt)]
        for a, b in zip(bounds, bounds[1:]):
            np.add.accumulate(times[a:b], out=times[a:b])
        times -= self.start_time
        block[1] = dt
        for name in ("num_seqs", "num_running", "num_waiting", "num_prefill_tokens", "num_decode_tokens",
                     "num_preemptions"):
            block[ITERATION_COLUMNS.index(name)] = np.repeat(runs[name], counts)
        if self._joined:  # requests that joined the queue during a run (its head waited: nobody was admitted)
            joined = np.bincount(np.array(self._joined, dtype=np.int64), minlength=len(dt)).astype(np.float64)
            block[ITERATION_COLUMNS.index("num_waiting")] += _cumsum_within_runs(joined, counts)
        # After a run's first iteration (which may admit), every request decodes.
        later = np.ones(len(dt), dtype=bool)
        later[np.cumsum(counts) - counts] = False
        block[ITERATION_COLUMNS.index("num_prefill_tokens")][later] = 0
        block[ITERATION_COLUMNS.index("num_decode_tokens")][later] = block[ITERATION_COLUMNS.index("num_seqs")][later]
        for name in ("token", "reserved", "internal_fragmentation", "overhead", "free"):
            block[ITERATION_COLUMNS.index(name)] = states[name]
        self.log.extend(block)


def _int64s(values: list[int]):
    """``values`` as a new int64 numpy array, packed into its memory by ``struct`` in one call: ~100 instructions an
    int, against ~210 for ``np.fromiter`` of the list (callgrind, benchmarks/README.md: issue 34's twelfth step). The
    same integers either way (native ``q`` is numpy's int64 here; one out of its range is an error either way)."""
    import numpy as np

    array: Any = np.empty(len(values), dtype=np.int64)  # (Any: numpy's stubs do not say it is a buffer)
    if values:
        pack_into(f"{len(values)}q", array, 0, *values)
    return array


def _before_growth(at_end, where, amounts, counts, run_ends, num):
    """Each iteration's count of a state that each run ends at ``at_end`` (its row's) after growing by ``amounts``
    at the iterations ``where``: the run's end less what it gains after the iteration, with ``gained`` the growth
    up to each iteration since the buffer's start. Whole numbers far below 2**53, so exact in float64 however they
    are summed: the same floats as adding each run's growth to its first iteration's count."""
    import numpy as np

    if not len(where):
        return np.repeat(at_end.astype(np.float64), counts)
    gained = np.cumsum(np.bincount(where, weights=amounts, minlength=num))
    return np.repeat(at_end - gained[run_ends - 1], counts) + gained


def _cumsum_within_runs(values, counts):
    """The running sum of per-iteration ``values``, restarting at each run (``counts``: iterations per run)."""
    import numpy as np

    total = np.cumsum(values)
    run_starts = np.cumsum(counts) - counts
    return total - np.repeat((total - values)[run_starts], counts)


@dataclass
class UsageIntegral:
    """Σ state × dt over iterations, in slot-seconds, and Σ dt: the time average's numerator and denominator."""

    token: float = 0.0
    reserved: float = 0.0
    internal_fragmentation: float = 0.0
    overhead: float = 0.0
    free: float = 0.0
    busy_time: float = 0.0
    num_iterations: int = 0
    sum_batch_size: int = 0

    def shares(self) -> dict[str, float]:
        """The paper's four shares, in percent, summing to 100 (external = allocator overhead + free)."""
        total = self.token + self.reserved + self.internal_fragmentation + self.overhead + self.free
        if total <= 0:
            return {key: 0.0 for key in SHARE_KEYS}
        return {
            "token": 100.0 * self.token / total,
            "reserved": 100.0 * self.reserved / total,
            "internal_fragmentation": 100.0 * self.internal_fragmentation / total,
            "external_fragmentation": 100.0 * (self.overhead + self.free) / total,
        }

    def detailed_shares(self) -> dict[str, float]:
        total = self.token + self.reserved + self.internal_fragmentation + self.overhead + self.free
        names = ("token", "reserved", "internal_fragmentation", "overhead", "free")
        if total <= 0:
            return {key: 0.0 for key in names}
        return {key: 100.0 * getattr(self, key) / total for key in names}

    @property
    def mean_batch_size(self) -> float:
        return self.sum_batch_size / self.num_iterations if self.num_iterations else 0.0


class RequestRecord(NamedTuple):
    """One request's outcome. A named tuple rather than a frozen dataclass: as immutable, and a long run builds
    a million of them (a frozen dataclass's constructor sets each field through object.__setattr__, ~5x
    slower). The simulator makes them with ``RequestRecord.__new__(RequestRecord, request_id=..., ...)``, as the
    scheduler its outputs (see kvlab.sched.output.SchedulerOutput): 4.7k instructions fewer a request."""

    request_id: int
    arrival_time: float
    prompt_len: int
    num_output_tokens: int
    status: str  # finished | rejected | aborted
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_preemptions: int
    reject_reason: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        if self.finish_time is None or self.first_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)

    @property
    def normalized_latency(self) -> float | None:
        e2e = self.e2e_latency
        return None if e2e is None else e2e / self.num_output_tokens


def distribution(values) -> dict[str, float | None]:
    """mean, p50, p90, p99 (linear interpolation between order statistics, as numpy's default) of a list or a
    numpy array of floats; the mean is the sum of the sorted values, left to right, over their number."""
    if not len(values):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ordered: Any
    if isinstance(values, list):
        ordered = sorted(values)
        total = sum(ordered)
    else:
        import numpy as np

        ordered = np.sort(values)
        total = float(np.add.accumulate(ordered)[-1])  # as sum(): left to right (np.sum would pair them up)
    n = len(ordered)

    def pct(q: float) -> float:
        pos = (n - 1) * q
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        low = float(ordered[lo])  # (Python floats: the same arithmetic for a list or an array)
        return low + (float(ordered[hi]) - low) * (pos - lo)

    return {"mean": total / n, "p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99)}


@dataclass
class Counters:
    num_finished: int = 0
    num_rejected: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0
    num_swapped_bytes: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)
    # Client deadlines (issue 32, kvlab.sim: a request whose client gave up is aborted as vLLM aborts it):
    # requests that arrived with one, those aborted, and the tokens they had computed in vain.
    num_with_deadline: int = 0
    num_aborted: int = 0
    num_wasted_tokens: int = 0
    # Speculative decoding (kvlab.spec): vLLM's SpecDecodingStats as summary fields; empty when off.
    spec_decoding: dict = field(default_factory=dict)
    # KV offload to CPU (kvlab.offload): prefix hits per tier and blocks moved; empty when off.
    kv_offload: dict = field(default_factory=dict)
    # The gateway in front of the router (kvlab.fleet.admission): its summary; empty when there is none.
    admission: dict = field(default_factory=dict)


def summarize(
    name: str,
    integral: UsageIntegral,
    records: list[RequestRecord],
    counters: Counters,
    makespan: float,
) -> dict:
    """The `kvlab race --json` entry of one strategy."""
    finished = [r for r in records if r.status == "finished"]
    latencies = _latencies(finished)

    def dist(attr: str) -> dict[str, float | None]:
        if latencies is not None:
            return distribution(latencies[attr])
        return distribution([v for r in finished if (v := getattr(r, attr)) is not None])

    return {
        "name": name,
        "memory_shares": integral.shares(),
        "memory_shares_detailed": integral.detailed_shares(),
        "mean_batch_size": integral.mean_batch_size,
        "throughput_rps": counters.num_finished / makespan if makespan > 0 else 0.0,
        # (finished requests' output tokens, as the legend says: an aborted request's tokens are wasted_tokens)
        "throughput_tps": _finished_tokens(finished) / makespan if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "num_iterations": integral.num_iterations,
        "ttft_s": dist("ttft"),
        "tpot_s": dist("tpot"),
        "e2e_latency_s": dist("e2e_latency"),
        "normalized_latency_s_per_token": dist("normalized_latency"),
        "preemptions": counters.num_preemptions,
        "recomputed_tokens": counters.num_recomputed_tokens,
        "swapped_bytes": counters.num_swapped_bytes,
        "num_finished": counters.num_finished,
        "num_rejected": counters.num_rejected,
        "reject_reasons": dict(counters.reject_reasons),
        # (only when clients had deadlines: the summaries of runs without them stay as they were)
        **(_abandonment(counters, len(records)) if counters.num_with_deadline else {}),
        **counters.spec_decoding,
        **counters.kv_offload,
        **({"admission": counters.admission} if counters.admission else {}),
    }


def _finished_tokens(finished: list[RequestRecord]) -> int:
    """The output tokens of the finished requests (not those an aborted or unfinished request sampled)."""
    return sum(map(itemgetter(RequestRecord._fields.index("num_output_tokens")), finished))


def _abandonment(counters: Counters, num_requests: int) -> dict:
    """Aborted requests (their client's deadline passed first), their share of the requests, and the tokens of
    KV computed for them in vain (docs/vllm.md, time-outs)."""
    return {"num_aborted": counters.num_aborted,
            "abandoned_share": counters.num_aborted / num_requests if num_requests else 0.0,
            "wasted_tokens": counters.num_wasted_tokens}


def _latencies(finished: list[RequestRecord]) -> dict | None:
    """The four latencies of every finished request as numpy arrays: the arithmetic of RequestRecord's
    properties, elementwise (so the same floats), for the millions of requests of a long run. None if a
    finished record misses a time (then the properties are used one by one)."""
    import numpy as np

    num = len(finished)
    # (map over itemgetter: no Python object per value, so no garbage-collector passes over a million records)
    column = RequestRecord._fields.index
    try:
        arrival, first_token, finish = (
            np.fromiter(map(itemgetter(column(name)), finished), dtype=np.float64, count=num)
            for name in ("arrival_time", "first_token_time", "finish_time")
        )
    except TypeError:  # a None
        return None
    num_output_tokens = np.fromiter(map(itemgetter(column("num_output_tokens")), finished), dtype=np.int64, count=num)
    e2e = finish - arrival
    several = num_output_tokens >= 2
    return {
        "ttft": first_token - arrival,
        "tpot": (finish - first_token)[several] / (num_output_tokens[several] - 1),
        "e2e_latency": e2e,
        "normalized_latency": e2e / num_output_tokens,
    }
