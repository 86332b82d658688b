"""The named workloads, kvlab's own and the published traces it reads: a plain dict of names to how each is built,
and a summary table of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from kvlab.errors import KvlabError
from kvlab.workload import published, sessions, synthetic, traces
from kvlab.workload.table import LengthTable, sample_table

KINDS = {
    "trace": "trace with arrivals",  # real (or the source's own synthetic) arrival times
    "lengths": "lengths only",  # real lengths; arrivals come from a process at a rate
    "stand-in": "stand-in",  # kvlab's fit to published numbers, not real rows
    "generated": "generated sessions",  # multi-turn conversations drawn by a generator (kvlab.workload.sessions)
}


@dataclass(frozen=True)
class BundledWorkload:
    """How to build one named workload.

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


# How each published trace is read (kvlab.workload.traces) and what it is; where it is published, its licence
# and checksum are in kvlab.workload.published.TRACES.
_TRACE_READERS: dict[str, tuple[str, str, Callable[[Path], LengthTable]]] = {
    "azure-conv": ("trace", "Azure production chat, 1 hour (2023-11-16), close to Poisson", traces.read_azure),
    "azure-code": ("trace", "Azure production code completion, 1 hour (2023-11-16), very bursty; long prompts, "
                   "short answers", traces.read_azure),
    "mooncake-conversation": ("trace", "Kimi conversation traffic, 1 hour, long prompts with shared prefixes "
                              "(hash_ids); 3 s bins spread evenly", partial(traces.read_mooncake, bin_width=3.0)),
    "mooncake-synthetic": ("trace", "Mooncake's synthetic trace: Poisson arrivals, long prompts, 65% prefix reuse "
                           "(hash_ids)", partial(traces.read_mooncake, bin_width=0.0)),
    "burstgpt": ("trace", "ChatGPT and GPT-4 conversation logs (BurstGPT_1: 2 months; its first 400 rows are 10 "
                 "quiet night hours); failed requests skipped", traces.read_burstgpt),
    "llmservingsim-sharegpt": ("trace", "ShareGPT (GPT-4 answers, Llama-3.1 tokenizer), outputs ≥ 512; the source's "
                               "synthetic Poisson arrivals at 10/s", traces.read_llmservingsim),
    "sharegpt-8k": ("lengths", "ShareGPT conversation turns (multi-turn context as prompt, Llama-2 tokenizer), "
                    "total ≤ 8,192", traces.read_length_stats),
    "arxiv": ("lengths", "arXiv summarization (Llama-2 tokenizer): long prompts, short answers",
              traces.read_length_stats),
    "bwb": ("lengths", "Bilingual Web Book translation (Llama-2 tokenizer): decode-heavy", traces.read_length_stats),
}


def _trace_rows(name: str, path: Path | None = None) -> LengthTable:
    """The rows of published trace ``name``: from ``path``, or from where kvlab.workload.published finds a copy. A
    copy that cannot be read says what would do: fetching it again (the cache), or the file as published."""
    if path is not None:
        return _TRACE_READERS[name][2](path)
    located = published.locate(name)
    if located is None:
        raise KvlabError(published.how_to_get(name))
    try:
        return _TRACE_READERS[name][2](located.path)
    except KvlabError as error:
        if located.where == "cache":
            raise KvlabError(f"{error}; the cached copy is damaged: run `kvlab workloads fetch {name}` again") from None
        raise


def trace_workload(name: str, path: Path | None = None) -> BundledWorkload:
    """Published trace ``name`` as a workload, read from ``path`` or from where a copy is found."""
    kind, summary, _ = _TRACE_READERS[name]
    trace = published.TRACES[name]
    source = f"{trace.publisher}; {trace.citation}"  # the address: published.TRACES[name].url
    return _from_rows(name, kind, summary, source, trace.licence, partial(_trace_rows, name, path))


_VLLM_PAPER = "Kwon et al., \"Efficient Memory Management for LLM Serving with PagedAttention\", SOSP 2023, Fig. 11"

WORKLOADS: dict[str, BundledWorkload] = {
    entry.name: entry
    for entry in (
        *(trace_workload(name) for name in _TRACE_READERS),
        _from_rows(
            "paper-sharegpt", "stand-in",
            "stand-in for the vLLM paper's ShareGPT sample (OPT tokenizer, ≤ 2,048 tokens): kvlab's fit of "
            "sharegpt-8k's shape, rescaled to the paper's means 161.31 / 337.99",
            f"kvlab's fit: means from {_VLLM_PAPER}; shape fitted to the sharegpt-8k trace (quantiles of "
            "each column and their rank correlation: kvlab/workload/data/paper_sharegpt_fit.json)",
            "Apache-2.0",
            synthetic.paper_sharegpt_population,
        ),
        BundledWorkload(
            "paper-alpaca", "stand-in",
            "stand-in for the vLLM paper's Alpaca sample (OPT tokenizer): independent lognormals with the "
            "paper's means 19.31 / 58.45 and the Azure chat trace's dispersion",
            f"kvlab's fit: means from {_VLLM_PAPER}; coefficients of variation 0.96 / 0.77 of the azure-conv trace",
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
    """One line of ``kvlab workloads``. A published trace that is not on this machine, or whose copy cannot be read,
    has no rows or means here (None); ``location`` says how to get it or what is wrong with the copy."""

    name: str
    kind: str  # one of KINDS' values
    num_rows: int | None  # rows in the source; None for a generated stand-in or an absent or unreadable trace
    num_skipped: int  # source rows that are not servable data
    mean_prompt_len: float | None
    mean_output_len: float | None
    mean_rate: float | None  # requests/s of the source's own arrivals; None without arrivals
    summary: str
    source: str
    licence: str
    copy: str  # "built in", "KVLAB_TRACES_DIR", "cache", "absent" or "unreadable"
    location: str  # the copy's path; how to fetch an absent trace; what is wrong with an unreadable copy
    url: str | None = None  # a published trace's address, checksum and file names (None for kvlab's own)
    checksum: str | None = None
    filenames: tuple[str, ...] | None = None

    @property
    def present(self) -> bool:
        return self.copy not in ("absent", "unreadable")


def describe(entry: BundledWorkload) -> WorkloadInfo:
    """Rows, means and rate of one workload (reads its file once per process); where a published trace was found.
    A trace that is absent or whose copy cannot be read is described as such, never raised: the listing is where a
    user looks when something is wrong."""
    trace = published.TRACES.get(entry.name)
    where = dict(url=trace.url, checksum=trace.checksum, filenames=trace.filenames) if trace else {}
    empty = (None, 0, None, None, None, entry.summary, entry.source, entry.licence)
    if trace is None:
        copy, location = "built in", "built in"
    else:
        try:
            located = published.locate(entry.name)
        except KvlabError as error:
            return WorkloadInfo(entry.name, KINDS[entry.kind], *empty, "unreadable", str(error), **where)
        if located is None:
            return WorkloadInfo(entry.name, KINDS[entry.kind], *empty, "absent",
                                f"kvlab workloads fetch {entry.name}", **where)
        copy, location = located.where, str(located.path)
    if entry.rows is None:
        mean_prompt, mean_output = entry.expected_means()
        return WorkloadInfo(
            entry.name, KINDS[entry.kind], None, 0, mean_prompt, mean_output, None,
            entry.summary, entry.source, entry.licence, copy, location, **where,
        )
    try:
        table = entry.rows()
    except KvlabError as error:
        return WorkloadInfo(entry.name, KINDS[entry.kind], *empty, "unreadable", str(error), **where)
    return WorkloadInfo(
        entry.name, KINDS[entry.kind], table.num_rows, table.num_skipped,
        float(table.prompt_len.mean()), float(table.output_len.mean()), table.own_rate,
        entry.summary, entry.source, entry.licence, copy, location, **where,
    )


def list_workloads() -> tuple[WorkloadInfo, ...]:
    """Every named workload, in ``WORKLOADS`` order, for a table."""
    return tuple(describe(entry) for entry in WORKLOADS.values())
