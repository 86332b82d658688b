"""Stand-ins for the vLLM paper's ShareGPT and Alpaca samples, which were never published.

The paper (Kwon et al., SOSP 2023, Figure 11) gives only the means of its samples, tokenized for OPT:
ShareGPT input 161.31 / output 337.99 tokens, Alpaca 19.31 / 58.45, and every request fits OPT's
max_model_len of 2,048 (prompt + output). A stand-in must match those means and the cap; its *shape* is a
stated choice, because the paper's results (Figure 2's memory shares especially) depend on it:

- ``paper-sharegpt`` keeps the shape of real ShareGPT conversations through kvlab's fit of them
  (``data/paper_sharegpt_fit.json``, written by ``fit_length_shape`` from the published ``sharegpt-8k`` trace:
  30,731 conversation turns of Sarathi-Serve's processed ShareGPT, Llama-2 tokenizer): 257 quantiles of each
  column and their Spearman rank correlation. The population is as many rows as the fit saw, drawn once from that
  fit (a Gaussian copula with the fitted rank correlation, a fixed seed, each column's ranks spread evenly over
  its quantile function), then each prompt and each output multiplied by one scale factor per column, rounded
  to whole tokens (at least 1), rows whose total exceeds 2,048 dropped, and the two factors solved so that the
  population means equal the paper's. Requests are rows of this population (``table.draw_rows``). kvlab ships
  the fit, not the trace: the stand-in needs no trace on the machine.
- ``paper-alpaca`` is parametric: prompt and output lengths independent lognormals whose dispersion is
  borrowed from a real chat trace (the Azure 2023 conversation trace, ``azure-conv``: coefficient of variation
  0.96 for prompts, 0.77 for outputs), with log-means solved so that the means of the rounded lengths equal the
  paper's; the rare pair over 2,048 tokens is dropped and drawn again.

docs/workloads.md reports the resulting distributions.
"""

from __future__ import annotations

import json
import math
from functools import cache
from importlib import resources

import numpy as np

from kvlab.workload.table import LengthTable

# Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention", Figure 11.
PAPER_SHAREGPT_MEANS = (161.31, 337.99)
PAPER_ALPACA_MEANS = (19.31, 58.45)
OPT_MAX_MODEL_LEN = 2048  # OPT's max_position_embeddings; the paper's cap on prompt + output

SHAREGPT_SHAPE = "sharegpt-8k"  # the published trace whose shape paper-sharegpt keeps
SHAREGPT_FIT_FILE = "paper_sharegpt_fit.json"  # kvlab's fit of it, in kvlab/workload/data
NUM_QUANTILES = 257  # quantiles per column in the fit: every 1/256 of probability, both ends included
POPULATION_SEED = 0  # the copula's draw that makes the population

# Coefficients of variation (std / mean) of the Azure 2023 conversation trace (azure-conv, 19,366 requests):
# ContextTokens 0.960, GeneratedTokens 0.771. Alpaca's own dispersion is not published.
ALPACA_PROMPT_CV = 0.96
ALPACA_OUTPUT_CV = 0.77

CHUNK = 4096  # rows drawn per call, fixed so that a seed's first k rows do not depend on how many were asked


def whole_tokens(x: np.ndarray) -> np.ndarray:
    """Lengths rounded half up to whole tokens, at least one (a request has a prompt and an answer)."""
    return np.maximum(np.floor(x + 0.5), 1).astype(np.int64)


def _solve_scale(values: np.ndarray, target_mean: float) -> float:
    """The factor ``a`` with mean(whole_tokens(a·values)) closest to ``target_mean`` (bisection; monotone in a)."""
    low, high = 0.0, 2.0 * target_mean / float(values.mean()) + 1.0
    for _ in range(60):
        mid = 0.5 * (low + high)
        if whole_tokens(mid * values).mean() < target_mean:
            low = mid
        else:
            high = mid
    below, above = whole_tokens(low * values).mean(), whole_tokens(high * values).mean()
    return low if abs(below - target_mean) < abs(above - target_mean) else high


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given the mean of the ranks they span (as Spearman's coefficient takes them)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2.0)[inverse]


def fit_length_shape(table: LengthTable, source: dict) -> dict:
    """kvlab's fit of a lengths table: each column's ``NUM_QUANTILES`` quantiles (numpy's linear method) and the
    columns' Spearman rank correlation; ``source`` says what was fitted (name, file, checksum)."""
    probabilities = np.linspace(0.0, 1.0, NUM_QUANTILES)
    prompt, output = table.prompt_len.astype(float), table.output_len.astype(float)
    spearman = float(np.corrcoef(_average_ranks(prompt), _average_ranks(output))[0, 1])
    return {
        "what": "kvlab's fit of a published trace's (prompt, output) lengths: quantiles of each column at "
                "probabilities 0, 1/256, ..., 1, and their Spearman rank correlation (kvlab.workload.synthetic)",
        "source": source,
        "num_rows": table.num_rows,
        "prompt_quantiles": [round(float(v), 6) for v in np.quantile(prompt, probabilities)],
        "output_quantiles": [round(float(v), 6) for v in np.quantile(output, probabilities)],
        "spearman": round(spearman, 6),
    }


@cache
def sharegpt_shape_fit() -> dict:
    """The shipped fit of ShareGPT's lengths (``data/paper_sharegpt_fit.json``)."""
    text = resources.files("kvlab.workload").joinpath("data", SHAREGPT_FIT_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


def population_from_fit(fit: dict, seed: int = POPULATION_SEED) -> tuple[np.ndarray, np.ndarray]:
    """``fit["num_rows"]`` (prompt, output) pairs drawn from a fit: a Gaussian copula whose correlation gives the
    fitted Spearman coefficient (ρ = 2 sin(π ρ_s / 6)), each column's ranks mapped to probabilities
    (rank − ½) / n and through its quantile function (linear between the fitted quantiles). Lengths are real
    numbers here; the stand-in scales and rounds them."""
    num = int(fit["num_rows"])
    rho = 2.0 * math.sin(math.pi * float(fit["spearman"]) / 6.0)
    z = np.random.default_rng(seed).standard_normal((num, 2))
    correlated = (z[:, 0], rho * z[:, 0] + math.sqrt(1.0 - rho * rho) * z[:, 1])
    probabilities = np.linspace(0.0, 1.0, len(fit["prompt_quantiles"]))
    columns = []
    for normal, quantiles in zip(correlated, (fit["prompt_quantiles"], fit["output_quantiles"])):
        ranks = np.argsort(np.argsort(normal, kind="stable"), kind="stable")
        columns.append(np.interp((ranks + 0.5) / num, probabilities, np.asarray(quantiles, dtype=float)))
    return columns[0], columns[1]


@cache
def paper_sharegpt_fit() -> tuple[float, float]:
    """The (prompt, output) scale factors that turn the ShareGPT shape's population into the paper's sample."""
    prompt, output = population_from_fit(sharegpt_shape_fit())
    target_prompt, target_output = PAPER_SHAREGPT_MEANS
    keep = np.ones(len(prompt), dtype=bool)
    # Dropping rows over the cap moves the means, which moves the factors, which may move the cap's cut:
    # iterate to the fixed point (with this shape the cap never binds, and one pass suffices).
    for _ in range(20):
        a = _solve_scale(prompt[keep], target_prompt)
        b = _solve_scale(output[keep], target_output)
        new_keep = whole_tokens(a * prompt) + whole_tokens(b * output) <= OPT_MAX_MODEL_LEN
        if np.array_equal(new_keep, keep):
            return a, b
        keep = new_keep
    raise RuntimeError("paper-sharegpt fit did not converge")


@cache
def paper_sharegpt_population() -> LengthTable:
    """The stand-in's population: the ShareGPT shape's rows rescaled, the rows over 2,048 tokens dropped."""
    shape_prompt, shape_output = population_from_fit(sharegpt_shape_fit())
    a, b = paper_sharegpt_fit()
    prompt, output = whole_tokens(a * shape_prompt), whole_tokens(b * shape_output)
    keep = prompt + output <= OPT_MAX_MODEL_LEN
    return LengthTable(
        prompt_len=prompt[keep],
        output_len=output[keep],
        num_skipped=int((~keep).sum()),
        skip_reason=f"rows over {OPT_MAX_MODEL_LEN} tokens after rescaling",
    )


def _lognormal_sigma(cv: float) -> float:
    # For a lognormal, CV² = exp(σ²) − 1.
    return math.sqrt(math.log1p(cv * cv))


def rounded_lognormal_mean(mu: float, sigma: float) -> float:
    """E[whole_tokens(X)] for X ~ lognormal(mu, sigma), exactly (up to a negligible tail).

    For an integer Y ≥ 1, E[Y] = 1 + Σ_{k≥1} P(Y > k), and Y > k ⇔ X ≥ k + ½ (k ≥ 1).
    P(X ≥ x) = ½·erfc((ln x − mu) / (sigma·√2)).
    """
    k_max = int(math.exp(mu + 8.0 * sigma)) + 2  # P(X > e^(mu+8σ)) ≈ 6e-16
    k = np.arange(1, k_max)
    z = (np.log(k + 0.5) - mu) / (sigma * math.sqrt(2.0))
    tail = 0.5 * np.array([math.erfc(v) for v in z.tolist()])
    return 1.0 + float(tail.sum())


def _solve_log_mean(target_mean: float, sigma: float) -> float:
    """The lognormal log-mean mu whose rounded lengths have mean ``target_mean``."""
    # Continuous lognormal: mean = exp(mu + sigma²/2). Rounding and the floor of one token shift the mean a
    # little; d ln(mean)/d mu is close to 1, so mu += ln(target / mean) converges in a few steps.
    mu = math.log(target_mean) - 0.5 * sigma * sigma
    for _ in range(100):
        mean = rounded_lognormal_mean(mu, sigma)
        if abs(mean - target_mean) < 1e-9 * target_mean:
            return mu
        mu += math.log(target_mean / mean)
    raise RuntimeError("paper-alpaca fit did not converge")


@cache
def paper_alpaca_fit() -> tuple[tuple[float, float], tuple[float, float]]:
    """((mu, sigma) of prompts, (mu, sigma) of outputs) of the Alpaca stand-in's lognormals."""
    target_prompt, target_output = PAPER_ALPACA_MEANS
    prompt_sigma, output_sigma = _lognormal_sigma(ALPACA_PROMPT_CV), _lognormal_sigma(ALPACA_OUTPUT_CV)
    return (
        (_solve_log_mean(target_prompt, prompt_sigma), prompt_sigma),
        (_solve_log_mean(target_output, output_sigma), output_sigma),
    )


def sample_paper_alpaca(num: int, rng: np.random.Generator) -> LengthTable:
    """``num`` requests of the Alpaca stand-in: independent rounded lognormals, pairs over 2,048 redrawn."""
    (prompt_mu, prompt_sigma), (output_mu, output_sigma) = paper_alpaca_fit()
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    num_drawn = 0
    while num_drawn < num:
        z = rng.standard_normal((CHUNK, 2))
        prompt = whole_tokens(np.exp(prompt_mu + prompt_sigma * z[:, 0]))
        output = whole_tokens(np.exp(output_mu + output_sigma * z[:, 1]))
        keep = prompt + output <= OPT_MAX_MODEL_LEN
        prompts.append(prompt[keep])
        outputs.append(output[keep])
        num_drawn += int(keep.sum())
    return LengthTable(prompt_len=np.concatenate(prompts)[:num], output_len=np.concatenate(outputs)[:num])
