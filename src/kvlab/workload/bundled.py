"""The bundled workloads: a plain dict of names to how each is built, and a summary table of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from kvlab.workload import sessions, synthetic, traces
from kvlab.workload.table import LengthTable, sample_table

KINDS = {
    "trace": "trace with arrivals",  # real (or the source's own synthetic) arrival times
    "lengths": "lengths only",  # real lengths; arrivals come from a process at a rate
    "stand-in": "stand-in",  # fitted to published numbers, not real rows
    "generated": "generated sessions",  # multi-turn conversations drawn by a generator (kvlab.workload.sessions)
}


@dataclass(frozen=True)
class BundledWorkload:
    """How to build one bundled workload.

    ``rows`` gives every row the source has (a trace's requests in arrival order; the ShareGPT stand-in's
    fitted population); ``sample(num, rng)`` draws ``num`` rows with a seeded generator. A generated
    stand-in has no rows; ``expected_means`` gives its model's exact (prompt, output) means instead.
    ``generate`` (sessions) draws whole conversations, arrivals and all: kvlab.workload.sessions.session_table.
    """

    name: str
    kind: str
    summary: str
    source: str
    licence: str
    sample: Callable[[int, np.random.Generator], LengthTable] | None = None
    rows: Callable[[], LengthTable] | None = None
    expected_means: Callable[[], tuple[float, float]] | None = None
    generate: Callable[..., LengthTable] | None = None


def _from_rows(
    name: str, kind: str, summary: str, source: str, licence: str, rows: Callable[[], LengthTable]
) -> BundledWorkload:
    def sample(num: int, rng: np.random.Generator) -> LengthTable:
        return sample_table(rows(), num, rng)

    return BundledWorkload(name, kind, summary, source, licence, sample=sample, rows=rows)


_AZURE = "Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_{}.csv; Patel et al., \"Splitwise\", ISCA 2024"
_MOONCAKE = "kvcache-ai/Mooncake, FAST25-release/traces/{}_trace.jsonl; Qin et al., \"Mooncake\", FAST 2025"
_VLLM_PAPER = "Kwon et al., \"Efficient Memory Management for LLM Serving with PagedAttention\", SOSP 2023, Fig. 11"

WORKLOADS: dict[str, BundledWorkload] = {
    entry.name: entry
    for entry in (
        _from_rows(
            "azure-conv", "trace",
            "Azure production chat, 1 hour (2023-11-16), close to Poisson",
            _AZURE.format("conv"), "CC-BY-4.0",
            partial(traces.read_azure, "azure2023_conv.csv"),
        ),
        _from_rows(
            "azure-code", "trace",
            "Azure production code completion, 1 hour (2023-11-16), very bursty; long prompts, short answers",
            _AZURE.format("code"), "CC-BY-4.0",
            partial(traces.read_azure, "azure2023_code.csv"),
        ),
        _from_rows(
            "mooncake-conversation", "trace",
            "Kimi conversation traffic, 1 hour, long prompts with shared prefixes (hash_ids); 3 s bins spread evenly",
            _MOONCAKE.format("conversation"), "Apache-2.0",
            partial(traces.read_mooncake, "mooncake_fast25_conversation_trace.jsonl", 3.0),
        ),
        _from_rows(
            "mooncake-synthetic", "trace",
            "Mooncake's synthetic trace: Poisson arrivals, long prompts, 65% prefix reuse (hash_ids)",
            _MOONCAKE.format("synthetic"), "Apache-2.0",
            partial(traces.read_mooncake, "mooncake_fast25_synthetic_trace.jsonl", 0.0),
        ),
        _from_rows(
            "burstgpt", "trace",
            "ChatGPT and GPT-4 conversation logs, 10 quiet night hours (first 400 rows of BurstGPT_1)",
            "HPMLL/BurstGPT, data/BurstGPT_1.csv (first 400 rows); Wang et al., \"BurstGPT\", KDD 2025",
            "CC-BY-4.0",
            partial(traces.read_burstgpt, "burstgpt1_first400.csv"),
        ),
        _from_rows(
            "llmservingsim-sharegpt", "trace",
            "ShareGPT (GPT-4 answers, Llama-3.1 tokenizer), outputs ≥ 512; the source's synthetic Poisson arrivals at 10/s",
            "casys-kaist/LLMServingSim, workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl (token ids dropped)",
            "MIT",
            partial(traces.read_llmservingsim, "llmservingsim_sharegpt_gpt4_llama31_300req.csv"),
        ),
        _from_rows(
            "sharegpt-8k", "lengths",
            "ShareGPT conversation turns (multi-turn context as prompt, Llama-2 tokenizer), total ≤ 8,192",
            "microsoft/sarathi-serve, data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
            "Apache-2.0",
            partial(traces.read_length_stats, "sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
        ),
        _from_rows(
            "arxiv", "lengths",
            "arXiv summarization (Llama-2 tokenizer): long prompts, short answers",
            "microsoft/vidur, data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
            "MIT",
            partial(traces.read_length_stats, "vidur_arxiv_summarization_stats_llama2_tokenizer.csv"),
        ),
        _from_rows(
            "bwb", "lengths",
            "Bilingual Web Book translation (Llama-2 tokenizer): decode-heavy",
            "project-etalon/etalon, data/processed_traces/bwb_stats_llama2_tokenizer_filtered_v2.csv",
            "Apache-2.0",
            partial(traces.read_length_stats, "vidur_bwb_stats_llama2_tokenizer.csv"),
        ),
        _from_rows(
            "paper-sharegpt", "stand-in",
            "stand-in for the vLLM paper's ShareGPT sample (OPT tokenizer, ≤ 2,048 tokens): "
            "sharegpt-8k's rows rescaled to the paper's means 161.31 / 337.99",
            f"fitted to {_VLLM_PAPER}; shape from microsoft/sarathi-serve's ShareGPT lengths (Apache-2.0)",
            "Apache-2.0",
            synthetic.paper_sharegpt_population,
        ),
        BundledWorkload(
            "paper-alpaca", "stand-in",
            "stand-in for the vLLM paper's Alpaca sample (OPT tokenizer): independent lognormals with the "
            "paper's means 19.31 / 58.45 and the Azure chat trace's dispersion",
            f"fitted to {_VLLM_PAPER}; dispersion from the Azure 2023 conversation trace (CC-BY-4.0)",
            "Apache-2.0",
            sample=synthetic.sample_paper_alpaca,
            expected_means=lambda: tuple(synthetic.rounded_lognormal_mean(*fit) for fit in synthetic.paper_alpaca_fit()),
        ),
        BundledWorkload(
            "sessions", "generated",
            "multi-turn chat: each turn's prompt is the conversation so far plus a new message (prefix caching sees "
            "the sharing); ShareGPT-like turns, 4 per session on average, 10 s apart (docs/fleet.md)",
            "kvlab's session generator (kvlab/workload/sessions.py); turn lengths from paper-sharegpt",
            "Apache-2.0",
            expected_means=lambda: sessions.default_means(synthetic.paper_sharegpt_population()),
            generate=sessions.session_table,
        ),
    )
}


@dataclass(frozen=True)
class WorkloadInfo:
    """One line of ``kvlab workloads``."""

    name: str
    kind: str  # one of KINDS' values
    num_rows: int | None  # rows in the source; None for a generated stand-in
    num_skipped: int  # source rows that are not servable data
    mean_prompt_len: float
    mean_output_len: float
    mean_rate: float | None  # requests/s of the source's own arrivals; None without arrivals
    summary: str
    source: str
    licence: str


def describe(entry: BundledWorkload) -> WorkloadInfo:
    """Rows, means and rate of one bundled workload (reads its file once per process)."""
    if entry.rows is None:
        mean_prompt, mean_output = entry.expected_means()
        return WorkloadInfo(
            entry.name, KINDS[entry.kind], None, 0, mean_prompt, mean_output, None,
            entry.summary, entry.source, entry.licence,
        )
    table = entry.rows()
    return WorkloadInfo(
        entry.name, KINDS[entry.kind], table.num_rows, table.num_skipped,
        float(table.prompt_len.mean()), float(table.output_len.mean()), table.own_rate,
        entry.summary, entry.source, entry.licence,
    )


def list_workloads() -> tuple[WorkloadInfo, ...]:
    """Every bundled workload, in ``WORKLOADS`` order, for a table."""
    return tuple(describe(entry) for entry in WORKLOADS.values())
