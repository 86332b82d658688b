"""Speculative decoding in the scheduler: the one rule, as vLLM V1's scheduler applies it.

vllm/v1/core/sched/scheduler.py, for a request with draft tokens (``spec_token_ids``, set by
``update_draft_token_ids`` after the proposer ran):

    schedule()            the running loop gives it ``num_tokens_with_spec - num_computed_tokens`` tokens: the token
                          it sampled last and its k drafts, all verified in one forward pass; the budget or
                          max_model_len may trim the drafts (those scheduled beyond ``num_tokens`` are the drafts).
                          allocate_slots reserves ``num_lookahead_tokens`` more slots for the EAGLE family.
    update_from_output()  the rejection sampler accepted a prefix of the drafts: ``num_rejected = num_draft_tokens -
                          num_accepted`` comes off ``num_computed_tokens`` (the rejected tokens' slots are written
                          over next time: the blocks stay with the request, the slots go back to reserved); the
                          request gains ``num_accepted + 1`` tokens, check_stop cutting them at its end.
    drafts                every request that sampled gets k new drafts for its next iteration (a request in the
                          middle of its prompt gets none; a preempted one loses its drafts).

kvlab.sched.scheduler's running loop already schedules ``num_tokens_with_spec`` (``SpecSeq``'s adds the drafts; a
plain Seq's is its num_tokens), and the lookahead slots are the allocator's (kvlab.spec.lookahead); this mixin
owns what happens after the iteration: the rejection sampler (each draft position accepted with its rate, given
that those before it were, from the simulation's own generator), the roll-back, and the next drafts. The
RunScheduler's bulk decode runs assume one token per request and iteration, which speculative decoding breaks: with
it on, the run scheduler steps (``_decoding`` stays False), and tests/test_spec.py checks that both schedulers
agree.
"""

from __future__ import annotations

import random

from kvlab.config.engine import CacheConfig, SchedulerConfig
from kvlab.memory.base import KVAllocator
from kvlab.sched.output import SchedulerOutput
from kvlab.sched.runs import RunScheduler
from kvlab.sched.scheduler import Scheduler
from kvlab.sched.seq import Seq, num_tokens_to_finish
from kvlab.spec.config import SpeculativeConfig


class SpecSeq(Seq):
    """A request with the draft tokens the proposer made for it last iteration, verified in its next (vLLM's
    ``spec_token_ids``)."""

    __slots__ = ("num_spec_tokens",)

    def __init__(self, request):
        super().__init__(request)
        self.num_spec_tokens = 0

    @property
    def num_tokens_with_spec(self) -> int:
        return self.request.prompt_len + self.num_output_tokens + self.num_spec_tokens


class RejectionSampler:
    """How many of ``num_draft_tokens`` drafts the target accepts: position i with ``rates[i]``, stopping at the
    first rejection (vllm/v1/sample/rejection_sampler.py accepts a prefix; its synthetic acceptance mode draws the
    same way). Its own generator: many simulations in one process never share a stream."""

    def __init__(self, rates: tuple[float, ...], seed: int = 0):
        self.rates = rates
        self.random = random.Random(seed).random

    def num_accepted(self, num_draft_tokens: int) -> int:
        draw = self.random
        for i in range(num_draft_tokens):
            if draw() >= self.rates[i]:
                return i
        return num_draft_tokens


class SpecDecodeStats:
    """vLLM's SpecDecodingStats (vllm/v1/spec_decode/metrics.py): drafts verified, draft tokens, accepted tokens,
    and accepted tokens per position."""

    def __init__(self, num_spec_tokens: int):
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = [0] * num_spec_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1

    def summary(self) -> dict:
        """The JSON summary's fields (vLLM logs the same as "Mean acceptance length" and per-position rates)."""
        drafts = self.num_drafts
        return {
            "spec_num_drafts": drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "spec_mean_acceptance_length": 1 + self.num_accepted_tokens / drafts if drafts else 1.0,
            # position (from 1) -> accepted / drafts: a mapping, flattened by a sweep's store into one column each
            "spec_acceptance_per_position": {str(i): n / drafts if drafts else 0.0
                                             for i, n in enumerate(self.num_accepted_tokens_per_pos, 1)},
        }


def merged_summary(summaries: list[dict]) -> dict:
    """Several engines' ``SpecDecodeStats.summary()`` as one (a fleet's replicas): the counts summed, the rates
    recomputed from them (each position's accepted drafts are its rate times the drafts). Empty when all are."""
    given = [s for s in summaries if s]
    if not given:
        return {}
    positions = max(len(s["spec_acceptance_per_position"]) for s in given)
    stats = SpecDecodeStats(positions)
    stats.num_drafts = sum(s["spec_num_drafts"] for s in given)
    stats.num_draft_tokens = sum(s["spec_num_draft_tokens"] for s in given)
    stats.num_accepted_tokens = sum(s["spec_num_accepted_tokens"] for s in given)
    stats.num_accepted_tokens_per_pos = [
        round(sum(s["spec_acceptance_per_position"].get(str(i), 0.0) * s["spec_num_drafts"] for s in given))
        for i in range(1, positions + 1)]
    return stats.summary()


class SpeculativeDecoding:
    """The mixin: put before a scheduler class (``SpecScheduler``, ``SpecRunScheduler``)."""

    seq_class = SpecSeq
    speculative: SpeculativeConfig
    sampler: RejectionSampler
    spec_stats: SpecDecodeStats

    def _init_spec(self, speculative: SpeculativeConfig) -> None:
        self.speculative = speculative
        self.sampler = RejectionSampler(speculative.rates, speculative.seed)
        self.spec_stats = SpecDecodeStats(speculative.num_speculative_tokens)

    def _compute(self, seq: SpecSeq, num_new: int, started: float, now: float) -> bool:
        """``seq`` verified ``num_new`` tokens, drafts among them: the sampler's verdict comes off its computed
        tokens, it gains the accepted drafts and the token the target sampled, and drafts again. True when it
        sampled (False: a chunk of a prompt)."""
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = started
        num_draft_tokens = seq.num_computed_tokens + num_new - seq.num_tokens  # those scheduled beyond num_tokens
        num_accepted = 0
        if num_draft_tokens > 0:
            num_accepted = self.sampler.num_accepted(num_draft_tokens)
            self.spec_stats.observe_draft(num_draft_tokens, num_accepted)
            num_new -= num_draft_tokens - num_accepted  # the rejected: vLLM's num_computed_tokens -= num_rejected
        seq.num_spec_tokens = 0
        seq.num_computed_tokens += num_new
        self.num_resident_computed_tokens += num_new  # type: ignore[attr-defined]
        if seq.num_computed_tokens < seq.num_tokens:
            return False
        left = num_tokens_to_finish(seq)
        num_sampled = min(num_accepted + 1, left)  # (check_stop cuts the accepted tokens at the request's end)
        seq.num_output_tokens += num_sampled
        self.num_sampled_tokens += num_sampled  # type: ignore[attr-defined]
        if seq.first_token_time is None:
            seq.first_token_time = now
        # The proposer drafts k tokens for its next iteration, kvlab stopping them at the answer's end (see
        # docs/speculative.md: vLLM drafts past an end it does not know; kvlab knows the answer's length).
        left -= num_sampled
        seq.num_spec_tokens = min(self.speculative.num_speculative_tokens, left - 1) if left else 0
        return True

    def _preempt(self, seq: SpecSeq) -> int:
        seq.num_spec_tokens = 0  # its drafts go with its KV
        return super()._preempt(seq)  # type: ignore[misc]


class SpecScheduler(SpeculativeDecoding, Scheduler):  # type: ignore[misc]  # (its seqs are all SpecSeq)
    """The stepping reference with speculative decoding."""

    def __init__(self, config: SchedulerConfig, allocator: KVAllocator, cache_config: CacheConfig | None = None, *,
                 speculative: SpeculativeConfig):
        Scheduler.__init__(self, config, allocator, cache_config)
        self._init_spec(speculative)


class SpecRunScheduler(SpeculativeDecoding, RunScheduler):  # type: ignore[misc]  # (its seqs are all SpecSeq)
    """RunScheduler with speculative decoding: every output a single iteration (its runs assume one token per
    request and iteration), the rest of its bookkeeping as without."""

    def __init__(self, config: SchedulerConfig, allocator: KVAllocator, cache_config: CacheConfig | None = None, *,
                 speculative: SpeculativeConfig):
        RunScheduler.__init__(self, config, allocator, cache_config)
        self._init_spec(speculative)

    def update_from_output(self, output: SchedulerOutput, now: float, started: float | None = None,
                           first_end: float | None = None) -> list[Seq]:
        finished = RunScheduler.update_from_output(self, output, now, started, first_end)
        self._decoding = False  # (a decode run would give each request one token an iteration, not 1 + accepted)
        return finished
