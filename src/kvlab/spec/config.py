"""What speculative decoding is configured by, in vLLM's names (vllm/config/speculative.py: SpeculativeConfig's
``method`` and ``num_speculative_tokens``), plus what a simulator must be told that a real engine measures: how
often the target model accepts a draft token.

    method                  ngram (prompt lookup, on the CPU), draft_model (a smaller model of the same family),
                            eagle or mtp (a one-layer head on the target's hidden states; vLLM's use_eagle() methods
                            reserve lookahead slots, vllm/v1/core/sched/scheduler.py: Scheduler.__init__ sets
                            num_lookahead_tokens to num_speculative_tokens for them)
    num_speculative_tokens  k: tokens drafted per request and iteration
    acceptance_rates        the chance that draft position i is accepted given that those before it were (one rate
                            for every position, or one per position: vLLM logs the same per-position counts,
                            vllm/v1/spec_decode/metrics.py SpecDecodingStats.num_accepted_tokens_per_pos)
    draft_cost_ratio        one drafter forward pass over the batch, as a share of a target decode pass over it (0
                            for ngram; resolved from the models for the others: kvlab.spec.cost)

The expected tokens a verify step yields (vLLM's "mean acceptance length", 1 + accepted / drafts) is
``expected_tokens_per_step``: 1 + sum over j of the product of the first j rates; (1 - a^(k+1)) / (1 - a) when every
position's rate is a (Leviathan et al. 2023, eq. 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError

# vLLM's methods, kvlab's spelling of them (``mtp``: DeepSeek's and Qwen's multi-token prediction heads, which vLLM
# drafts with the EAGLE proposer) and whether the method reserves lookahead slots (SpeculativeConfig.use_eagle()).
SPEC_METHODS = {"ngram": False, "draft_model": False, "eagle": True, "mtp": True}


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    acceptance_rates: tuple[float, ...]
    draft_cost_ratio: float = 0.0
    seed: int = 0  # the rejection sampler's (each simulation owns its generator)
    draft_model: str | None = None  # draft_model's catalogue id (what draft_cost_ratio was resolved from)
    # The draft model's weights on each GPU and its KV bytes per token on each GPU: vLLM loads it beside the target
    # and its attention layers take blocks of the same KV cache (kvlab.config.resolve sizes the pool with both).
    draft_weights_bytes: int = 0
    draft_kv_bytes_per_token: int = 0

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise KvlabError(f"--speculative-method {self.method!r}; valid: {', '.join(SPEC_METHODS)}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or k < 1:
            raise KvlabError(f"--num-speculative-tokens {k!r}; valid: a whole number of draft tokens, at least 1 "
                             "(leave speculative decoding off by not giving --speculative-method)")
        if len(self.acceptance_rates) not in (1, k):
            raise KvlabError(f"--spec-acceptance has {len(self.acceptance_rates)} rates for {k} speculative tokens; "
                             f"valid: one rate for every position, or {k} (one per position)")
        for rate in self.acceptance_rates:
            if not 0.0 <= rate <= 1.0:
                raise KvlabError(f"--spec-acceptance {rate!r} is out of range; valid: a probability from 0 to 1")
        if not self.draft_cost_ratio >= 0.0:
            raise KvlabError(f"draft cost ratio {self.draft_cost_ratio!r}; valid: 0 or more")

    @property
    def rates(self) -> tuple[float, ...]:
        """One acceptance rate per draft position (a single rate repeated k times)."""
        if len(self.acceptance_rates) == self.num_speculative_tokens:
            return self.acceptance_rates
        return self.acceptance_rates * self.num_speculative_tokens

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots a running request's allocation reserves beyond its scheduled tokens (vLLM: the EAGLE family's k)."""
        return self.num_speculative_tokens if SPEC_METHODS[self.method] else 0

    @property
    def expected_tokens_per_step(self) -> float:
        return expected_tokens_per_step(self.rates)


def expected_tokens_per_step(rates: tuple[float, ...]) -> float:
    """Tokens one verify step of a request with ``len(rates)`` drafts yields on average: the token the target samples
    anyway plus each draft accepted, draft j only if all before it were: 1 + sum_j prod_{i<=j} rates[i]."""
    total, run = 1.0, 1.0
    for rate in rates:
        run *= rate
        total += run
    return total


def parse_acceptance(text: str | float) -> tuple[float, ...]:
    """``0.7`` (every position) or ``0.9/0.7/0.5`` (one per position) as a tuple of rates; refused in one line."""
    valid = "valid: a probability from 0 to 1, or one per position separated by slashes (0.9/0.7/0.5)"
    if isinstance(text, float | int):
        return (float(text),)
    parts = str(text).split("/")
    rates = []
    for position, part in enumerate(parts, start=1):
        if not part.strip():
            where = "is empty" if len(parts) == 1 else f"position {position} of {len(parts)} is empty"
            raise KvlabError(f"--spec-acceptance {text!r}: {where}; {valid}")
        try:
            rates.append(float(part))
        except ValueError:
            raise KvlabError(f"--spec-acceptance {text!r}: {part!r} is not a number; {valid}") from None
    return tuple(rates)
