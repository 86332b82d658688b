"""``load_workload``: a bundled name or a user's file, plus arrivals, limits and a seed, into a ``Workload``.

Which arrivals a workload gets (``arrival``):

    "auto"     the source's own arrival times if it has them (rescaled to ``rate`` if one is given),
               otherwise Poisson at ``rate``
    "trace"    the source's own arrival times, unchanged (a ``rate`` contradicts this)
    "poisson"  a Poisson process at ``rate`` (default for a trace: the trace's own mean rate)
    "gamma"    a gamma renewal process at ``rate`` with coefficient of variation ``cv``
    "burst"    everyone at t = 0 (a ``rate`` contradicts this)

With the source's own arrivals, requests are the source's rows in arrival order. Otherwise rows are drawn
with the seed: a random permutation of the source's rows, pass after pass (``table.draw_rows``), or the
stand-in's generator. Lengths and arrivals use independent streams of one seed, so changing the rate
does not change the lengths.
"""

from __future__ import annotations

import gc
import math
from dataclasses import replace
from itertools import repeat
from pathlib import Path

import numpy as np

from kvlab.config.options import DEFAULT_NUM_REQUESTS
from kvlab.errors import KvlabError
from kvlab.workload.arrivals import burst_arrivals, generate_arrivals, rescale_arrivals
from kvlab.workload.bundled import WORKLOADS, BundledWorkload, trace_workload
from kvlab.workload.files import SUFFIXES, read_user_file
from kvlab.workload.inference_perf import DEFAULT_SEED as INFERENCE_PERF_SEED
from kvlab.workload.inference_perf import SUFFIXES as INFERENCE_PERF_SUFFIXES
from kvlab.workload.inference_perf import inference_perf_source
from kvlab.workload.priority import clients_note, with_clients
from kvlab.workload.published import trace_for_file
from kvlab.workload.request import Request
from kvlab.workload.sessions import SessionSpec
from kvlab.workload.table import LengthTable, sample_table
from kvlab.workload.traces import HEADER_FORMATS, format_of
from kvlab.workload.workload import Workload

ARRIVALS = ("auto", "trace", "poisson", "gamma", "burst")

# DEFAULT_NUM_REQUESTS: requests drawn from a stand-in when neither num_requests nor duration is given (it has no
# rows to count); declared with the options.


LONG_REQUESTS = ("reject", "clip")


def _check_options(num_requests, duration, rate, arrival, cv, seed, max_model_len, long_requests) -> None:
    """Messages spell the CLI's flags, the spelling users meet first (the library's names are the same words)."""
    from kvlab.validate import check_options

    if arrival not in ARRIVALS:
        raise KvlabError(f"--arrival {arrival!r} is not an arrival process; valid: {', '.join(ARRIVALS)}")
    if long_requests not in LONG_REQUESTS:
        raise KvlabError(f"--long-requests {long_requests!r}; valid: {', '.join(LONG_REQUESTS)}")
    check_options({"num_requests": num_requests, "duration": duration, "rate": rate, "cv": cv, "seed": seed,
                   "max_model_len": max_model_len})
    if cv != 1.0 and arrival != "gamma":
        raise KvlabError(f"--cv {cv:g} applies only to --arrival gamma (--arrival is {arrival})")
    if rate is not None and arrival in ("trace", "burst"):
        what = "keeps the trace's own arrival times" if arrival == "trace" else "puts every request at t = 0"
        raise KvlabError(
            f"--rate {rate:g} contradicts --arrival {arrival}, which {what}; "
            "drop --rate, or use --arrival auto for arrivals at the rate (a trace's own times rescaled to it, else "
            "Poisson arrivals)"
        )
    if max_model_len is not None and max_model_len < 2:
        raise KvlabError(f"--max-model-len {max_model_len} leaves no room for an answer; valid: 2 tokens or more")
    if long_requests == "clip" and max_model_len is None:
        raise KvlabError("--long-requests clip needs the --max-model-len to clip to")


# The latest arrival kvlab simulates (seconds, ~32 years): a float64 clock there still resolves a microsecond,
# where an iteration's milliseconds would otherwise round away (--rate 1e-15 put a trillion years between requests).
MAX_ARRIVAL_S = 1e9


def _check_span(times) -> None:
    if len(times) and float(times[-1]) > MAX_ARRIVAL_S:
        raise KvlabError(
            f"the requests would arrive over {float(times[-1]):.3g} s (the last one's arrival time), beyond the "
            f"{MAX_ARRIVAL_S:.0e} s (~32 years) the simulator's clock keeps to the microsecond; raise --rate, "
            "or keep fewer requests (-n, --duration)"
        )


def _user_source(spec: str) -> BundledWorkload:
    """A user's file, described like a bundled trace (its arrival times are its own); a copy of a published trace
    (known by its file name) is read as that trace."""
    path = Path(spec)
    if not path.exists():
        names = ", ".join(WORKLOADS)
        raise KvlabError(f"unknown workload {spec!r}{did_you_mean(spec)}: not a named workload ({names}) and no such "
                         "file")
    trace = trace_for_file(path)
    if trace is not None and path.is_file():
        entry = trace_workload(trace.name, path)
        differs = copy_note(spec)
        return entry if differs is None else replace(entry, name=path.name, summary=f"{entry.summary} ({differs})")
    fmt = format_of(path) if path.is_file() else None
    if fmt is not None:
        table = HEADER_FORMATS[fmt][1](path)
        summary = f"requests from {spec}, read in the {fmt} format (its columns say it)"
    else:
        table = read_user_file(spec)
        summary = f"{'turns of conversations' if table.is_conversation else 'requests'} from {spec}"
    return BundledWorkload(
        name=path.name,
        kind="trace" if table.has_arrivals else "lengths",
        summary=summary,
        source=str(path),
        licence="",
        sample=lambda num, rng: sample_table(table, num, rng),
        rows=lambda: table,
    )


def copy_note(spec: str) -> str | None:
    """One line when ``spec`` is a file under a published trace's file name that is not the published file (a
    subset, a copy cut short): it is then labelled with its own name, not the trace's. None otherwise."""
    from kvlab.workload.fetch import differs_from_published

    path = Path(spec)
    trace = None if spec in WORKLOADS else trace_for_file(path)
    if trace is None or not path.is_file():
        return None
    return differs_from_published(trace, path)


def order_note(spec: str) -> str | None:
    """One line when ``spec`` is a file whose rows are not in arrival order (kvlab runs them sorted, stably)."""
    path = Path(spec)
    if spec in WORKLOADS or path.suffix.lower() not in SUFFIXES or not path.is_file():
        return None
    entry = _user_source(spec)
    table = entry.rows() if entry.rows is not None else None
    if table is None or not table.num_out_of_order:
        return None
    count = table.num_out_of_order
    return (f"{path.name}: {count:,} row{'s arrive' if count != 1 else ' arrives'} earlier than the row before; kvlab "
            "runs the requests in arrival order (rows with equal times in the file's order)")


def has_own_deadlines(spec: str) -> bool:
    """Whether a workload's requests come with their own client deadlines: a user's file with a timeout column (a
    named workload, a published trace or an inference-perf configuration has none)."""
    path = Path(spec)
    if spec in WORKLOADS or path.suffix.lower() not in SUFFIXES or not path.is_file() or trace_for_file(path):
        return False
    if format_of(path) is not None:
        return False
    return read_user_file(spec).timeout is not None


def did_you_mean(spec: str) -> str:
    """' (did you mean 'azure-conv'?)' for a misspelt workload name, as `workloads fetch` says it of a trace's (the
    same difflib match, after a name the spelling starts with: 'azure-conversation' is closer by difflib to
    'mooncake-conversation' than to 'azure-conv'); two at most; '' where no name is close."""
    import difflib

    lowered = spec.strip().lower()
    starts = [name for name in WORKLOADS if lowered.startswith(name) or name.startswith(lowered)] if lowered else []
    close = list(dict.fromkeys(starts + difflib.get_close_matches(lowered, list(WORKLOADS), n=2)))[:2]
    return f" (did you mean {' or '.join(repr(name) for name in close)}?)" if close else ""


def _resolve(spec: str, num_requests: int | None = None, duration: float | None = None,
             arrival_seed: int | None = INFERENCE_PERF_SEED) -> BundledWorkload:
    """The source of a workload; ``num_requests`` / ``duration``: an inference-perf configuration, replayed at its own
    arrival times, builds only the requests they keep; ``arrival_seed``: its constant timer's draw (None: evenly
    spaced; kvlab.workload.inference_perf.arrival_times)."""
    if spec in WORKLOADS:
        return WORKLOADS[spec]
    if Path(spec).suffix.lower() in INFERENCE_PERF_SUFFIXES:  # an inference-perf configuration (issue 29)
        return inference_perf_source(spec, num_requests, duration, arrival_seed)
    if Path(spec).suffix.lower() not in SUFFIXES and not Path(spec).exists():
        names = ", ".join(WORKLOADS)
        raise KvlabError(f"unknown workload {spec!r}{did_you_mean(spec)}; named: {names}; or a path to a .csv or "
                         ".jsonl file"
                         " (or an inference-perf .yaml)")
    return _user_source(spec)


def _own_arrivals(
    entry: BundledWorkload, table: LengthTable, num_requests: int | None, duration: float | None, rate: float | None
) -> tuple[LengthTable, np.ndarray, str]:
    times = table.arrival_time
    how = "own arrivals"
    if rate is not None:
        times = rescale_arrivals(times, rate)
        how = f"own arrivals rescaled to {rate:g} req/s"
    num = table.num_rows
    if duration is not None:
        num = int(np.searchsorted(times, duration, side="left"))
        if num == 0:
            raise KvlabError(
                f"no request of {entry.name} arrives before --duration {duration:g} s (the first arrives at "
                f"{times[0]:g} s); valid: a longer --duration"
            )
    if num_requests is not None:
        if num_requests > table.num_rows:
            raise KvlabError(
                f"{entry.name} has {table.num_rows:,} requests with their own arrival times, not {num_requests:,}; "
                "ask for fewer, or for --arrival poisson or gamma to draw its lengths as often as needed"
            )
        num = min(num, num_requests)
    rows = np.arange(num)
    return table.take(rows), times[:num], how


def _generated(entry: BundledWorkload, spec: SessionSpec, num_requests, duration, rate, arrival, cv, seed,
               max_model_len) -> tuple[LengthTable, np.ndarray, str]:
    """Sessions drawn whole (kvlab.workload.sessions): their turns' lengths, arrival times and content."""
    assert entry.generate is not None
    if rate is None:
        raise KvlabError(f"{entry.name} needs --rate (requests/s): sessions start at the rate over the turns they "
                         "hold")
    if num_requests is None and duration is None:
        num_requests = DEFAULT_NUM_REQUESTS
    lengths = WORKLOADS.get(spec.lengths)
    if lengths is None or lengths.rows is None:
        names = ", ".join(name for name, e in WORKLOADS.items() if e.rows is not None)
        raise KvlabError(f"--session-lengths {spec.lengths!r}: the lengths of turns come from a bundled workload's "
                         f"rows; valid: {names}")
    process = "poisson" if arrival == "auto" else arrival
    table = entry.generate(spec, lengths.rows(), num_requests=num_requests, duration=duration, rate=rate,
                           arrival=process, cv=cv, seed=seed, max_model_len=max_model_len)
    if not table.num_rows:
        raise KvlabError(f"no turn arrives before --duration {duration:g} s at {rate:g} req/s; valid: a longer "
                         "--duration")
    assert table.arrival_time is not None
    starts = "Poisson" if process == "poisson" else f"gamma (CV {cv:g})"
    how = (f"sessions starting as {starts} at {rate:g} req/s over their turns (mean {spec.turns:g} "
           f"{spec.turns_dist}), turns {spec.think_time_s:g} s apart ({spec.think_time_dist})")
    if spec.system_prompt_len:
        how += (f", {spec.system_prompt_share:.0%} opening with one of {spec.num_system_prompts} system prompts of "
                f"{spec.system_prompt_len:,} tokens")
    return table, table.arrival_time, how


def _new_arrivals(
    entry: BundledWorkload,
    lengths_rng: np.random.Generator,
    arrivals_rng: np.random.Generator,
    *,
    num_requests: int | None,
    duration: float | None,
    rate: float | None,
    arrival: str,
    cv: float,
) -> tuple[LengthTable, np.ndarray, str]:
    table = entry.rows() if entry.rows is not None else None
    if table is not None and table.is_conversation:
        raise KvlabError(f"{entry.name} holds conversations: its turns keep their own arrivals, in their sessions' "
                         f"order; valid: --arrival auto or trace (--rate rescales them), not --arrival {arrival}")
    # Without a limit: one pass over a source's rows; a stand-in's rows are a model, not a count.
    default_num = DEFAULT_NUM_REQUESTS if table is None or entry.kind == "stand-in" else table.num_rows
    if arrival == "burst":
        times = burst_arrivals(num_requests or default_num)
        how = "all at t = 0"
    else:
        if rate is None:
            rate = table.own_rate if table is not None else None
            if rate is None:
                raise KvlabError(
                    f"{entry.name} has no arrival times to take a rate from: give --rate (requests/s) for "
                    f"--arrival {arrival}, or --arrival burst to queue every request at t = 0"
                )
        if num_requests is None and duration is None:
            num_requests = default_num
        times = generate_arrivals(arrival, rate, arrivals_rng, num=num_requests, duration=duration, cv=cv)
        how = f"Poisson at {rate:g} req/s" if arrival == "poisson" else f"gamma at {rate:g} req/s, CV {cv:g}"
        if len(times) == 0:
            raise KvlabError(f"no request arrives before --duration {duration:g} s at {rate:g} req/s; valid: a longer "
                             "--duration")
    assert entry.sample is not None  # (a generated workload went to _generated)
    return entry.sample(len(times), lengths_rng), times, how


def _cap_at_max_model_len(table: LengthTable, max_model_len: int) -> tuple[list[int | None], int]:
    """Each request's max_tokens with the answer stopped at max_model_len, as vLLM stops it.

    vLLM's default max_tokens is max_model_len − prompt_len, and a sequence stops when it reaches
    max_model_len. Prompts of max_model_len tokens or more are left alone: the engine rejects them.
    """
    caps = list(table.max_tokens) if table.max_tokens is not None else [None] * table.num_rows
    room = (max_model_len - table.prompt_len).tolist()
    num_capped = 0
    for i, (output_len, space) in enumerate(zip(table.output_len.tolist(), room)):
        wanted = output_len if caps[i] is None else min(output_len, caps[i])
        if 0 < space < wanted:
            caps[i] = space
            num_capped += 1
    return caps, num_capped


def _build_requests(table: LengthTable, times: np.ndarray, max_tokens: list[int | None] | None) -> tuple[Request, ...]:
    num = table.num_rows
    columns = [range(num), times.tolist(), table.prompt_len.tolist(), table.output_len.tolist()]
    if max_tokens is not None or table.prefix_hashes is not None:
        columns.append(max_tokens if max_tokens is not None else [None] * num)
    if table.prefix_hashes is not None:  # (the table's chunk length with its ids: not every source's is 512)
        columns += [table.prefix_hashes, repeat(table.prefix_chunk_len, num)]
    if table.prefix_len is not None:  # (Request's fields in order: prefix_chunk_len, n, prefix_len)
        columns += [repeat(1, num), table.prefix_len]
    # A million small frozen objects: the cyclic collector would walk them again and again while they are
    # made, and none of them can be part of a cycle.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return tuple(map(Request, *columns))
    finally:
        if was_enabled:
            gc.enable()


def _mean_lengths(entry: BundledWorkload, table: LengthTable | None) -> tuple[float, float]:
    if table is not None:
        return float(table.prompt_len.mean()), float(table.output_len.mean())
    return entry.expected_means() if entry.expected_means is not None else (0.0, 0.0)


def _kept(num_requests, duration, rate, arrival) -> tuple[int | None, float | None]:
    """(num_requests, duration) that keep the first requests of a source replayed at its own arrival times: only
    those need building; (None, None) when arrivals are drawn anew or rescaled (every row is used)."""
    return (num_requests, duration) if arrival in ("auto", "trace") and rate is None else (None, None)


def estimate_workload(spec: str, *, num_requests: int | None = None, duration: float | None = None,
                      rate: float | None = None, arrival: str = "auto") -> tuple[int, float]:
    """(requests, mean prompt + output tokens) that ``load_workload`` would build, without building them: what
    the work gate (kvlab.validate.check_simulation_work) weighs before anything is drawn."""
    entry = _resolve(spec, *_kept(num_requests, duration, rate, arrival))
    table = entry.rows() if entry.rows is not None else None
    prompt, output = _mean_lengths(entry, table)
    if arrival in ("auto", "trace") and table is not None and table.has_arrivals:
        num = table.num_rows if num_requests is None else min(num_requests, table.num_rows)
        return num, prompt + output
    default_num = DEFAULT_NUM_REQUESTS if table is None or entry.kind == "stand-in" else table.num_rows
    rate = rate if rate is not None else (table.own_rate if table is not None else None)
    if arrival == "burst" or duration is None or rate is None:
        return (num_requests or default_num), prompt + output
    expected = math.ceil(duration * rate)
    return (expected if num_requests is None else min(expected, num_requests)), prompt + output


def _clip_to_max_model_len(table: LengthTable, max_model_len: int) -> tuple[LengthTable, int]:
    """Vidur's clip: a request whose prompt + output exceeds max_model_len has both scaled down by the same factor
    (floored, at least one token each), so that it fits. Returns the table and how many requests were clipped."""
    total = table.prompt_len + table.output_len
    over = total > max_model_len
    if not over.any():
        return table, 0
    scale = max_model_len / total
    prompt = np.where(over, np.maximum(1, np.floor(table.prompt_len * scale)), table.prompt_len).astype(np.int64)
    output = np.where(over, np.maximum(1, np.minimum(np.floor(table.output_len * scale), max_model_len - prompt)),
                      table.output_len).astype(np.int64)
    clipped = LengthTable(prompt_len=prompt, output_len=output, max_tokens=table.max_tokens,
                          prefix_hashes=table.prefix_hashes, priority=table.priority, timeout=table.timeout)
    return clipped, int(over.sum())


def _check_generated_arrival(spec: str, arrival: str) -> None:
    """A generated workload (sessions) starts its sessions at --rate, so it has neither a trace's times nor a burst:
    refused first, in one line, before --rate's checks would send the user between the two (trial 46)."""
    entry = WORKLOADS.get(spec)
    if entry is None or entry.generate is None or arrival not in ("trace", "burst"):
        return
    what = "as a burst" if arrival == "burst" else "on a trace's own times (it has none)"
    raise KvlabError(f"--workload {spec} cannot arrive {what}: sessions start at --rate; valid: --arrival auto, "
                     "poisson or gamma, with --rate")


def load_workload(
    spec: str,
    *,
    num_requests: int | None = None,
    duration: float | None = None,
    rate: float | None = None,
    arrival: str = "auto",
    cv: float = 1.0,
    seed: int = 0,
    max_model_len: int | None = None,
    long_requests: str = "reject",
    sessions: SessionSpec | None = None,
    priority_classes: str | None = None, timeout: str | None = None,
    arrival_seed: int | None = INFERENCE_PERF_SEED,  # (kvlab.workload.inference_perf.arrival_times' seed)
) -> Workload:
    """The requests of a bundled workload (``WORKLOADS``) or of a user's .csv / .jsonl file.

    ``num_requests`` keeps the first N requests, ``duration`` the requests arriving before that many
    seconds (both: whichever stops first). ``max_model_len`` sets each request's ``max_tokens`` so that
    prompt + answer stops at that length, as vLLM does (longer prompts are left for the engine to reject);
    ``long_requests="clip"`` instead scales prompt and output of a too-long request down to fit, as Vidur does.
    Same arguments, same requests, in any process. See the module docstring for ``arrival``. A workload beyond
    kvlab.validate's memory limit is refused before any request is drawn (``allow_large_work`` lifts it).
    ``sessions`` sets the session generator's parameters (the ``sessions`` workload only; its defaults otherwise).
    ``priority_classes``, ``timeout``: the clients' classes, deadlines (kvlab.workload.priority). ``arrival_seed``:
    an inference-perf configuration's timer draw at its own times, or None: evenly spaced."""
    from kvlab.validate import check_simulation_work

    _check_generated_arrival(spec, arrival)
    _check_options(num_requests, duration, rate, arrival, cv, seed, max_model_len, long_requests)
    num_requests = None if num_requests is None else int(num_requests)
    max_model_len = None if max_model_len is None else int(max_model_len)
    entry = _resolve(spec, *_kept(num_requests, duration, rate, arrival), arrival_seed)
    if sessions is not None and entry.generate is None:
        raise KvlabError(f"session options apply to --workload sessions only (--workload is {entry.name})")
    num_expected, mean_len = estimate_workload(spec, num_requests=num_requests, duration=duration, rate=rate,
                                               arrival=arrival)
    check_simulation_work(num_expected, mean_len, 1, f"workload {entry.name}", memory_only=True)
    lengths_seed, arrivals_seed = np.random.SeedSequence(int(seed)).spawn(2)
    lengths_rng, arrivals_rng = np.random.default_rng(lengths_seed), np.random.default_rng(arrivals_seed)

    source_table = entry.rows() if entry.rows is not None else None
    has_arrivals = source_table is not None and source_table.has_arrivals
    if arrival == "trace" and not has_arrivals:
        raise KvlabError(
            f"{entry.name} has no arrival times of its own ({entry.kind}); use --arrival poisson or gamma with --rate"
        )
    if entry.generate is not None:
        table, times, how = _generated(entry, sessions or SessionSpec(), num_requests, duration, rate, arrival, cv,
                                       seed, max_model_len)
    elif arrival in ("auto", "trace") and has_arrivals:
        table, times, how = _own_arrivals(entry, source_table, num_requests, duration, rate)
    else:
        process = "poisson" if arrival == "auto" else arrival
        table, times, how = _new_arrivals(
            entry, lengths_rng, arrivals_rng,
            num_requests=num_requests, duration=duration, rate=rate, arrival=process, cv=cv,
        )

    _check_span(times)
    num_clipped = 0
    if long_requests == "clip" and table.is_conversation:
        raise KvlabError(f"--long-requests clip would cut turns of {entry.name}'s conversations, whose prompts repeat "
                         "each other; valid: --long-requests reject (a session's context stays within its own cap)")
    if long_requests == "clip":
        table, num_clipped = _clip_to_max_model_len(table, max_model_len)
    max_tokens = list(table.max_tokens) if table.max_tokens is not None else None
    num_capped = 0
    if max_model_len is not None:
        max_tokens, num_capped = _cap_at_max_model_len(table, max_model_len)
        if num_capped == 0 and table.max_tokens is None:
            max_tokens = None
    requests = _build_requests(table, times, max_tokens)
    requests = with_clients(requests, table.priority, priority_classes, timeout, seed, table.timeout)
    description = _describe(entry, source_table, table, times, how, seed, max_model_len, num_capped)
    description += clients_note(priority_classes, timeout, table.timeout is not None)
    if long_requests == "clip":
        description += (f" {num_clipped:,} requests longer than max_model_len {max_model_len:,} clipped (prompt and "
                        "output scaled down together, as Vidur does).")
    return Workload(name=entry.name, requests=requests, description=description, source=entry.source)


def _describe(entry, source_table, table, times, how, seed, max_model_len, num_capped) -> str:
    parts = [f"{entry.name} ({entry.kind}): {table.num_rows:,} requests", how]
    if times[-1] > 0:
        parts.append(f"last arrival at {times[-1]:,.1f} s")
    parts.append(f"mean prompt {table.prompt_len.mean():,.1f}, mean output {table.output_len.mean():,.1f} tokens")
    if source_table is not None and source_table.num_skipped:
        parts.append(
            f"{source_table.num_skipped} of {source_table.num_rows + source_table.num_skipped} source rows "
            f"skipped ({source_table.skip_reason})"
        )
    if source_table is not None and source_table.num_out_of_order:
        parts.append(f"run in arrival order ({source_table.num_out_of_order:,} of the file's rows arrive earlier "
                     "than the row before)")
    if max_model_len is not None:
        parts.append(f"{num_capped:,} answers capped at max_model_len {max_model_len:,}")
    parts.append(f"seed {seed}")
    return "; ".join(parts) + ". " + entry.summary + "."
