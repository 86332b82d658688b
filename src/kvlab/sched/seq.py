"""A request as the engine tracks it while serving it (vLLM's ``Request`` object)."""

from __future__ import annotations

import enum
from typing import Any

from mypy_extensions import mypyc_attr

from kvlab.workload.request import Request


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue; its KV dropped (recompute) or on the CPU (swap)
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"  # its client gave up (a deadline passed): vLLM's FINISHED_ABORTED


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (mypyc), subclassed by kvlab.spec's SpecSeq
class Seq:
    """Mutable serving state of one request. ``num_tokens`` = prompt + generated so far, as in vLLM: the
    scheduler gives each request ``num_tokens - num_computed_tokens`` new tokens (its whole prompt, a chunk of
    it, or the one token sampled last)."""

    __slots__ = (
        "request",
        "request_id",
        "prompt_len",
        "final_output_tokens",
        "num_computed_tokens",
        "num_output_tokens",
        "status",
        "num_preemptions",
        "num_lost_tokens",
        "swapped",
        "first_scheduled_time",
        "first_token_time",
        "finish_time",
        "reject_reason",
        "num_cached_tokens",
        "synced_clock",
        "stamp",
    )

    def __init__(self, request: Request):
        self.request = request
        # (the id as the object the request holds, typed Any: compiled, an int attribute is boxed anew at each read, an
        # allocation above 256, and a dict keyed by ids then compares it with its key where this finds the key itself;
        # benchmarks/README.md, the eighteenth step)
        self.request_id: Any = request.request_id
        # The request's prompt length and answer length (its num_output_tokens), copied from it once (a Request
        # is frozen): compiled, each read of a Request's field is a generic attribute lookup, ~160 instructions,
        # and the scheduler reads these several times a request (benchmarks/README.md, the eighteenth step).
        self.prompt_len = request.prompt_len
        self.final_output_tokens = request.num_output_tokens
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.status = SeqStatus.WAITING
        self.num_preemptions = 0
        self.num_lost_tokens = 0  # computed tokens dropped by preemptions, not yet recomputed
        self.swapped = False
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.reject_reason: str | None = None
        # vLLM's Request.num_cached_tokens: the prompt tokens its first admission found in the prefix cache (None
        # until then; a preempted request keeps the first admission's).
        self.num_cached_tokens: int | None = None
        # The scheduler's decode clock when the counters above were last brought up to date (Scheduler.sync),
        # and the order of its admission to the running batch (the running queue's order).
        self.synced_clock = 0
        self.stamp = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output_tokens

    # vLLM's Request.num_tokens_with_spec, what the running loop schedules up to: ``num_tokens`` itself but for
    # speculative decoding's requests, which add their drafts (kvlab.spec.scheduler). Its own sum, not an alias of
    # ``num_tokens``: mypyc compiles no class attribute bound to a property (it left the alias unset).
    @property
    def num_tokens_with_spec(self) -> int:
        return self.prompt_len + self.num_output_tokens

    def __repr__(self) -> str:
        return (
            f"Seq(id={self.request_id}, {self.status.value}, computed={self.num_computed_tokens}, "
            f"tokens={self.num_tokens}, out={self.num_output_tokens}/{self.request.num_output_tokens})"
        )


def num_tokens_to_finish(seq: Seq) -> int:
    """When a request finishes, the one rule (vLLM's check_stop, vllm/v1/core/sched/utils.py, for kvlab's
    requests): it stops when its output reaches its length, the true answer capped by ``max_tokens`` (and, as it
    arrives, by max_model_len). Returns the tokens it still samples: it finishes in the iteration that samples
    the last of them, the k-th from now in which it samples when this is k (a run of k decode iterations ends
    with its finish; one step finishes it when this is 1), and it has finished when this is 0."""
    return seq.final_output_tokens - seq.num_output_tokens

