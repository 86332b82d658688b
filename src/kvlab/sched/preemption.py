"""What happens to an evicted request's KV: dropped and computed again later, or copied to CPU memory and
brought back. One small class per mode; the scheduler does the evicting (newest running request first)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvlab.config.engine import CacheConfig
    from kvlab.sched.seq import Seq


class PreemptionMode(Protocol):
    def on_preempt(self, seq: Seq) -> int:
        """The request was evicted (its blocks already freed): keep or drop its KV; returns the bytes copied out to
        the CPU (0 when it is recomputed)."""
        ...

    def on_resume(self, seq: Seq) -> int:
        """The request is admitted again: returns the bytes of KV copied back."""
        ...


def drop_kv(seq: Seq) -> None:
    """What recomputation loses: every token the request had computed, counted as lost until it is computed again
    (the waiting loop counts what it recomputes, less what the prefix cache still holds)."""
    seq.num_lost_tokens += seq.num_computed_tokens
    seq.num_computed_tokens = 0


class Recompute:
    """vLLM V1's only mode: the request's blocks are freed and its tokens computed again when it resumes."""

    def __init__(self, cache_config: CacheConfig | None):
        del cache_config  # recomputation keeps no state: the request's tokens are simply computed again

    def on_preempt(self, seq: Seq) -> int:
        drop_kv(seq)
        return 0

    def on_resume(self, seq: Seq) -> int:
        return 0


class Swap:
    """vLLM's older engine: the request's KV is copied to a bounded CPU swap space and copied back when it
    resumes (vLLM paper §4.5). When the swap space is full, the request is recomputed instead."""

    def __init__(self, cache_config: CacheConfig | None):
        # Without a cache config there is no swap space: every preempted request is recomputed.
        self.capacity_bytes = cache_config.swap_space_bytes if cache_config is not None else 0
        self.kv_bytes_per_token = cache_config.kv_bytes_per_token if cache_config is not None else 0
        self.used_bytes = 0

    def on_preempt(self, seq: Seq) -> int:
        nbytes = seq.num_computed_tokens * self.kv_bytes_per_token
        if nbytes == 0 or self.used_bytes + nbytes > self.capacity_bytes:
            drop_kv(seq)  # no room on the CPU: recomputed instead
            return 0
        self.used_bytes += nbytes
        seq.swapped = True
        return nbytes

    def on_resume(self, seq: Seq) -> int:
        if not seq.swapped:
            return 0
        nbytes = seq.num_computed_tokens * self.kv_bytes_per_token
        self.used_bytes -= nbytes
        return nbytes


PREEMPTION: dict[str, type[Recompute] | type[Swap]] = {"recompute": Recompute, "swap": Swap}
