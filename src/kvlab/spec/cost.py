"""What drafting adds to an iteration's time. The verify pass needs nothing new: the target computes the token
sampled last and the drafts in one forward pass, priced by the cost model as any scheduled tokens (each draft a
query token over the request's context).

The proposer runs after the target, on the requests that sampled, k times (vllm/v1/spec_decode: EagleProposer and
DraftModelProposer.propose draft one token per forward pass; NgramProposer matches the context on the CPU):

    draft_seconds = k × draft_cost_ratio × (a target decode pass over the iteration's requests and context)

``draft_cost_ratio``: 0 for ngram (kvlab prices no CPU time for it), one decoder layer of the target for eagle
and mtp (1 / num_hidden_layers: the head is a single layer on the target's hidden states), and the draft model's
active parameters over the target's for draft_model (a decode pass is mostly reading weights).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.errors import KvlabError

if TYPE_CHECKING:
    from kvlab.cost import CostModel
    from kvlab.sched.output import SchedulerOutput
    from kvlab.spec.config import SpeculativeConfig


def draft_seconds(speculative: SpeculativeConfig, cost: CostModel, out: SchedulerOutput) -> float:
    """The proposer's time after the iteration ``out`` (a single iteration: speculative decoding steps)."""
    ratio = speculative.draft_cost_ratio
    num_seqs = out.num_decode_tokens and out.num_seqs  # (an iteration of prompts only: nobody drafts yet)
    if not ratio or not num_seqs:
        return 0.0
    one_pass = cost.iteration_times(num_seqs, 0, num_seqs, out.num_context_tokens, out.num_context_tokens)
    return speculative.num_speculative_tokens * ratio * one_pass


def draft_cost_ratio(method: str, target, draft=None) -> float:
    """A drafter pass as a share of a target decode pass (module doc); ``target`` and ``draft`` are catalogue
    model specs (kvlab.catalog), ``draft`` needed by draft_model only."""
    if method == "ngram":
        return 0.0
    if method in ("eagle", "mtp"):
        return 1.0 / target.num_hidden_layers
    if draft is None:
        raise KvlabError("--speculative-method draft_model needs --speculative-model: a catalogue model other than "
                         "the target, normally smaller (see `kvlab models`; a larger one runs, with a warning)")
    return draft.num_active_params / target.num_active_params
