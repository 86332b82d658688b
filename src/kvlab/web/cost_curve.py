"""Why batching more is faster, from kvlab's cost model: one decode iteration's time against its batch size.

A decode iteration of ``b`` conversations, each reading ``c`` tokens of KV, costs (kvlab/cost/model.py)

    t(b) = max(weights + b·c·kv_per_token, compute(b)) + overhead  (+ per-sequence terms, if the profile has them)

The weights are read once whatever ``b`` is, so while the iteration is memory-bound by the weights, twice the
batch costs little more than one and makes twice the tokens: tokens per second = b / t(b). The lab draws t(b)
and b / t(b) and marks where each run's batch is. ``c`` is the workload's mean context over a conversation's
life (its prompt and half its answer), stated on the figure.
"""

from __future__ import annotations


def batch_cost_curve(cost, requests, max_batch: int) -> dict:
    """``seconds[b - 1]``: one decode iteration of b conversations under ``cost`` (a CostModel), for every b from 1
    to ``max_batch``; ``weights_s``: the part that reads the weights (the same for every b); ``compute_from``: the
    first b at which the iteration is compute-bound (None: memory-bound throughout)."""
    if requests:
        context = round(sum(r.prompt_len + r.num_output_tokens / 2 for r in requests) / len(requests))
    else:
        context = 1
    seconds, compute_from = [], None
    for b in range(1, max(1, max_batch) + 1):
        terms = cost.terms(b, 0, b, b * context, b * context)
        seconds.append(terms.total)
        if compute_from is None and terms.bound == "compute":
            compute_from = b
    weights_s = cost.terms(1, 0, 1, context, context).weights
    return {"context_len": context, "profile": cost.profile, "seconds": seconds, "weights_s": weights_s,
            "compute_from": compute_from}
