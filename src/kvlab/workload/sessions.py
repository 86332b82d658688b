"""Multi-turn chat sessions: each turn's prompt is the conversation so far plus a new message.

    session:  [system prompt] [message 1] [answer 1] [message 2] [answer 2] ... [message k] [answer k]
    turn k:   prompt = system prompt + (message i + answer i, i < k) + message k;   it generates answer k
              arrives think_time after turn k - 1 arrived

So turn k's prompt begins with turn k - 1's whole sequence, prompt and answer: with prefix caching, on the engine
where the conversation last ran, its blocks are still cached (unless evicted since), and only the new message is
computed. Sessions that open with the same system prompt share it, across conversations.

The generator's parameters (``SessionSpec``; docs/fleet.md):

    turns              mean turns per session (>= 1)
    turns_dist         geometric (after each turn the user goes on with probability 1 - 1/turns; mean turns) or
                       fixed (every session has ``turns`` turns)
    think_time_s       mean seconds from one turn's arrival to the next's (open loop: it covers the answer's own
                       time, which the workload cannot know; a turn that comes before the last answer is done
                       finds only what was cached by then)
    think_time_dist    exponential or fixed
    lengths            the named workload whose rows give each turn's (message, answer) lengths, one row a turn
                       (default paper-sharegpt: ShareGPT-like turns, means 161 / 338)
    system_prompt_len  tokens of each system prompt (0: none)
    num_system_prompts distinct system prompts, each session drawing one uniformly
    system_prompt_share the share of sessions that open with a system prompt
    max_context_len    a session ends before a turn whose prompt + answer would exceed it (a first turn is cut
                       to fit); default: the engine's max_model_len when given, else 2,048
    chunk_len          tokens per content id (16: every block size kvlab takes is a multiple, so sharing is
                       exact block by block)

Sessions start as a Poisson (or gamma) process at ``rate / turns`` sessions per second, so requests arrive at
``rate`` per second once sessions overlap (fewer when the context cap ends sessions early; the description says
the rate of the requests drawn). Each draw comes from its own stream of the seed in fixed-size chunks: the first
sessions are the same however many are drawn.

Content: a session's tokens are named, chunk after chunk of ``chunk_len``, by ids (``Request.prefix_hashes``),
and each turn's ids name its whole sequence, answer included (``Request.prefix_len``). A chunk wholly inside a
system prompt has that prompt's id; every other chunk its session's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from kvlab.errors import KvlabError
from kvlab.workload.arrivals import generate_arrivals
from kvlab.workload.table import LengthTable, draw_rows

TURNS_DISTS = ("geometric", "fixed")
THINK_TIME_DISTS = ("exponential", "fixed")
DEFAULT_MAX_CONTEXT_LEN = 2048
# Tokens per content id: every block size kvlab takes is a multiple, so sharing is exact block by block.
CONTENT_CHUNK_LEN = 16
CHUNK = 4096  # values drawn per call, fixed so that the first sessions do not depend on how many are drawn


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """The session generator's parameters (module doc). Checked when made: a KvlabError names the value."""

    turns: float = 4.0
    turns_dist: str = "geometric"
    think_time_s: float = 10.0
    think_time_dist: str = "exponential"
    lengths: str = "paper-sharegpt"
    system_prompt_len: int = 0
    num_system_prompts: int = 1
    system_prompt_share: float = 1.0
    max_context_len: int | None = None
    chunk_len: int = CONTENT_CHUNK_LEN

    def __post_init__(self) -> None:
        _check(math.isfinite(self.turns) and self.turns >= 1, f"--session-turns {self.turns!r}: a mean number of "
               "turns per session, 1 or more")
        _check(self.turns_dist in TURNS_DISTS, f"--session-turns-dist {self.turns_dist!r}; valid: "
               f"{', '.join(TURNS_DISTS)}")
        _check(self.turns_dist != "fixed" or float(self.turns).is_integer(), f"--session-turns {self.turns!r} "
               "with --session-turns-dist fixed: every session has that many turns; valid: a whole number")
        _check(math.isfinite(self.think_time_s) and self.think_time_s >= 0, f"--think-time {self.think_time_s!r}: "
               "seconds between a session's turns; valid: a number >= 0")
        _check(self.think_time_dist in THINK_TIME_DISTS, f"--think-time-dist {self.think_time_dist!r}; valid: "
               f"{', '.join(THINK_TIME_DISTS)}")
        _check(_whole(self.system_prompt_len) and self.system_prompt_len >= 0, f"--system-prompt-len "
               f"{self.system_prompt_len!r}: tokens; valid: a whole number >= 0")
        _check(_whole(self.num_system_prompts) and self.num_system_prompts >= 1, f"--num-system-prompts "
               f"{self.num_system_prompts!r}; valid: a whole number >= 1")
        _check(math.isfinite(self.system_prompt_share) and 0 <= self.system_prompt_share <= 1,
               f"--system-prompt-share {self.system_prompt_share!r}; valid: a share from 0 to 1")
        _check(self.max_context_len is None or (_whole(self.max_context_len) and self.max_context_len >= 2),
               f"--max-context-len {self.max_context_len!r}: tokens; valid: a whole number >= 2")
        _check(_whole(self.chunk_len) and self.chunk_len >= 1, f"chunk_len {self.chunk_len!r}; valid: a whole "
               "number >= 1")

    @property
    def continue_probability(self) -> float:
        return 1.0 - 1.0 / self.turns


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise KvlabError(message)


def _chunked(draw, num: int) -> np.ndarray:
    """``num`` values of ``draw(CHUNK)``, chunk after chunk: the first k do not depend on ``num``."""
    chunks = [draw(CHUNK) for _ in range(-(-num // CHUNK))]
    return np.concatenate(chunks)[:num] if chunks else np.empty(0)


@cache
def default_means(lengths: LengthTable) -> tuple[float, float]:
    """Mean prompt and answer of the default sessions over ``lengths`` (the default's, paper-sharegpt's rows; 4,000
    turns of seed 0): what `kvlab workloads` lists."""
    table = session_table(SessionSpec(), lengths, num_requests=4000, duration=None, rate=1.0)
    return float(table.prompt_len.mean()), float(table.output_len.mean())


@dataclass(frozen=True, slots=True)
class _Draws:
    """Every random draw of the first sessions but their start times, before the context cap."""

    turns: np.ndarray
    think: np.ndarray  # one per turn, session after session (a session's first is unused)
    rows: np.ndarray  # one lengths row per turn, likewise
    system_prompt: np.ndarray  # per session: -1 none, else which


def _streams(seed: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(5)]


def _draw(spec: SessionSpec, num_sessions: int, streams: list[np.random.Generator], num_rows: int) -> _Draws:
    if spec.turns_dist == "fixed":
        turns = np.full(num_sessions, int(spec.turns), dtype=np.int64)
    else:
        turns = _chunked(lambda n: streams[1].geometric(1.0 / spec.turns, n), num_sessions).astype(np.int64)
    num_turns = int(turns.sum())
    if spec.think_time_dist == "fixed":
        think = np.full(num_turns, float(spec.think_time_s))
    else:
        think = _chunked(lambda n: streams[2].standard_exponential(n), num_turns) * spec.think_time_s
    rows = draw_rows(num_rows, num_turns, streams[3])
    which = _chunked(lambda n: streams[4].integers(0, spec.num_system_prompts, n), num_sessions).astype(np.int64)
    opens = _chunked(lambda n: streams[4].random(n), num_sessions) < spec.system_prompt_share
    return _Draws(turns, think, rows, np.where(opens, which, -1))


def _kept_turns(spec: SessionSpec, draws: _Draws, messages: np.ndarray, answers: np.ndarray,
                max_context_len: int) -> list[tuple[int, int, int, int]]:
    """(session, index of its think time, message, answer) of every turn kept, session after session."""
    kept = []
    first_turn = 0
    for s, num_turns in enumerate(draws.turns.tolist()):
        context = spec.system_prompt_len if draws.system_prompt[s] >= 0 else 0
        for k in range(num_turns):
            i = first_turn + k
            message, answer = int(messages[draws.rows[i]]), int(answers[draws.rows[i]])
            if k == 0:  # the first turn is cut to fit; a later one that does not fit ends the session
                message = max(1, min(message, max_context_len - context - 1))
                answer = max(1, min(answer, max_context_len - context - message))
            elif context + message + answer > max_context_len:
                break
            kept.append((s, i, message, answer))
            context += message + answer
        first_turn += num_turns
    return kept


def check_context_cap(max_context_len: int | None, max_model_len: int | None) -> None:
    """A session's context cap above the engine's max_model_len lets turns grow into requests it rejects as too
    long: refused (trial 46), for a run (kvlab.service.engine, with the engine's max_model_len) and here."""
    if max_context_len is not None and max_model_len is not None and max_context_len > max_model_len:
        raise KvlabError(f"--max-context-len {max_context_len:,} exceeds max_model_len {max_model_len:,}: the engine "
                         f"would reject the turns past it as too long; valid: at most {max_model_len:,} (or raise "
                         "--max-model-len)")


def session_table(spec: SessionSpec, lengths: LengthTable, *, num_requests: int | None, duration: float | None,
                  rate: float, arrival: str = "poisson", cv: float = 1.0, seed: int = 0,
                  max_model_len: int | None = None) -> LengthTable:
    """The turns of sessions as one table in arrival order, with their content ids, each turn's (message, answer)
    lengths a row of ``lengths`` (the rows of ``spec.lengths``, which the caller looked up): the first ``num_requests``
    turns to arrive, or those arriving before ``duration`` seconds (both: whichever stops first). ``rate`` is
    requests per second: sessions start at ``rate`` over the mean turns a session keeps under the context cap
    (measured on the seed's first CHUNK sessions, so that it does not depend on how many are drawn)."""
    if arrival not in ("poisson", "gamma"):
        raise KvlabError(f"--arrival {arrival} for sessions: sessions start as a Poisson or gamma process; valid: "
                         "--arrival poisson or gamma (auto: poisson)")
    check_context_cap(spec.max_context_len, max_model_len)
    max_context_len = spec.max_context_len or max_model_len or DEFAULT_MAX_CONTEXT_LEN
    if spec.system_prompt_len + 2 > max_context_len:
        raise KvlabError(f"--system-prompt-len {spec.system_prompt_len:,} leaves no room for a message and an "
                         f"answer in a context of {max_context_len:,} tokens; valid: at most {max_context_len - 2:,}")
    num_sessions = max(CHUNK, 0 if num_requests is None else math.ceil(2 * num_requests / spec.turns))
    while True:
        streams = _streams(seed)
        draws = _draw(spec, num_sessions, streams, lengths.num_rows)
        kept = _kept_turns(spec, draws, lengths.prompt_len, lengths.output_len, max_context_len)
        mean_turns = sum(1 for turn in kept if turn[0] < CHUNK) / CHUNK
        starts = generate_arrivals(arrival, rate / mean_turns, streams[0], num=num_sessions, cv=cv)
        turns = _timed(kept, starts, draws.think)
        complete = float(starts[-1])  # sessions not drawn start after the last drawn: earlier turns are all here
        if duration is not None and complete >= duration:
            turns = [turn for turn in turns if turn[1] < duration][:num_requests]
            break
        if duration is None and num_requests is not None and sum(t < complete for _, t, _, _ in turns) >= num_requests:
            turns = turns[:num_requests]
            break
        num_sessions *= 2
    return _with_content(spec, turns, draws.system_prompt)


def _timed(kept: list[tuple[int, int, int, int]], starts: np.ndarray,
           think: np.ndarray) -> list[tuple[int, float, int, int]]:
    """(session, arrival, message, answer) in arrival order: a session's first turn at its start, each later one
    a think time after the one before."""
    turns = []
    t, session = 0.0, -1
    for s, i, message, answer in kept:
        t = float(starts[s]) if s != session else t + float(think[i])
        session = s
        turns.append((s, t, message, answer))
    turns.sort(key=lambda turn: (turn[1], turn[0]))
    return turns


def _with_content(spec: SessionSpec, turns: list[tuple[int, float, int, int]], system_prompt: np.ndarray) -> LengthTable:
    """The turns as rows, each prompt the session's context so far plus its message, with content ids."""
    num_full = spec.system_prompt_len // spec.chunk_len  # a system prompt's chunks (a partial last is its session's)
    openings: dict[int, tuple[tuple[int, ...], int]] = {}
    context: dict[int, int] = {}
    rows = []
    for session, _, message, answer in turns:
        if session not in context:
            which = int(system_prompt[session])
            context[session] = spec.system_prompt_len if which >= 0 else 0
            if which >= 0:
                openings[session] = (tuple(range(which * num_full, (which + 1) * num_full)), spec.system_prompt_len)
        prompt = context[session] + message
        rows.append((session, prompt, answer))
        context[session] = prompt + answer
    hashes, prefix_len = conversation_ids(rows, spec.chunk_len, openings, first_id=spec.num_system_prompts * num_full)
    return LengthTable(
        prompt_len=np.array([prompt for _, prompt, _ in rows], dtype=np.int64),
        output_len=np.array([answer for _, _, answer in rows], dtype=np.int64),
        arrival_time=np.array([t for _, t, _, _ in turns], dtype=float),
        prefix_hashes=hashes, prefix_len=prefix_len, prefix_chunk_len=spec.chunk_len,
    )


def conversation_ids(turns, chunk_len: int, openings: dict | None = None, *,
                     first_id: int = 0) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Content ids for turns of conversations, ``(session, prompt_len, output_len)`` in arrival order: each turn's
    ids name its whole sequence (``prefix_len`` = prompt + answer). A turn whose prompt is longer than its
    session's context so far (the turn before: prompt and answer; or ``openings[session]``: a system prompt's
    ``(full chunk ids, length)``) repeats that context and adds to it: the session's chunk ids go on. A prompt
    no longer than that context is taken to repeat its first ``prompt_len - 1`` tokens (a prompt's last token is
    its own) and then to differ: from the chunk where it does, new ids. Ids a session adds are numbered on from
    ``first_id``; no two sessions share one."""
    openings = openings or {}
    next_id = first_id
    streams: dict[int, tuple[list[int], int]] = {}  # session -> (its chunk ids, tokens so far)
    hashes, prefix_len = [], []
    for session, prompt, output in turns:
        if session in streams:
            ids, context = streams[session]
        else:
            opening, context = openings.get(session, ((), 0))
            ids = list(opening)
        if prompt <= context:  # it repeats part of the conversation only: keep the chunks wholly before it differs
            del ids[(prompt - 1) // chunk_len:]
        total = prompt + output
        missing = -(-total // chunk_len) - len(ids)
        if missing > 0:
            ids.extend(range(next_id, next_id + missing))
            next_id += missing
        hashes.append(tuple(ids))
        prefix_len.append(total)
        streams[session] = (ids, total)
    return tuple(hashes), tuple(prefix_len)
