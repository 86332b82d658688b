"""Speculative decoding as vLLM V1 schedules it (docs/speculative.md): a proposer drafts k tokens per request, the
next iteration verifies them with the target model, and what was rejected is taken back."""

from kvlab.spec.config import SPEC_METHODS, SpeculativeConfig, expected_tokens_per_step

__all__ = ["SPEC_METHODS", "SpeculativeConfig", "expected_tokens_per_step"]
