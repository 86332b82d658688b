"""Published request traces: where each is published, its licence and checksum, and where kvlab finds a copy.

kvlab ships no one else's trace. A named trace (``azure-conv``, ``mooncake-conversation``, ...) is read from a
copy the user has, looked for in this order:

    1. a path the user gives: ``--workload ~/Downloads/AzureLLMInferenceTrace_conv.csv`` (any of the trace's
       file names, ``TRACES[name].filenames``) is read as that trace (a file under such a name that is not the
       published file is labelled with its own name, with a note: kvlab.workload.fetch.differs_from_published;
       under any other name, a published format is told by its columns: kvlab.workload.traces.format_of);
    2. ``$KVLAB_TRACES_DIR``: a folder holding any of those file names (tests and CI point it at
       ../shared/data/traces);
    3. the user's cache folder (``$KVLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvlab``, else ``~/.cache/kvlab``,
       then ``traces/``), where ``kvlab workloads fetch NAME`` puts the published file after checking its
       checksum (kvlab.workload.fetch).

Each address is pinned to a commit, so its bytes, and therefore its checksum, do not move under kvlab.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kvlab.errors import KvlabError

TRACES_DIR_VARIABLE = "KVLAB_TRACES_DIR"
CACHE_DIR_VARIABLE = "KVLAB_CACHE_DIR"


@dataclass(frozen=True)
class PublishedTrace:
    """One trace as its publisher put it online.

    ``filenames``: the published file's name first (what a fetch saves), then other names a copy may go by
    (the shortened names of the traces' collection in ../shared/data/traces). ``checksum`` is ``sha256:HEX`` of
    the published bytes, or ``git-blob-sha1:HEX`` (git's object id of the file, what the publisher's repository
    names it by) where the file is too large for the mirror kvlab's checksums were taken from."""

    name: str
    publisher: str
    url: str
    checksum: str
    size_bytes: int | None
    licence: str
    citation: str
    filenames: tuple[str, ...]

    @property
    def filename(self) -> str:
        return self.filenames[0]


_AZURE_COMMIT = "b469a113cedca53ddc3bdea71a143dc4b7d8700c"
_MOONCAKE_COMMIT = "3b5a594133958449a1feaf1c9e0fc1b553e34a28"
_ETALON_COMMIT = "d5f18de15a2227a2d469365afc4fa9e2df0c631d"
_VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
_BURSTGPT_COMMIT = "e92f533b6c85ea7f4164fb3d97d1aa2c3edacbc8"
_LLMSERVINGSIM_COMMIT = "5daddb21a545658d5150b535712d0494584b5278"


def _github(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


_SPLITWISE = 'Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024'
_MOONCAKE = 'Qin et al., "Mooncake: Trading More Storage for Less Computation", FAST 2025'

TRACES: dict[str, PublishedTrace] = {
    trace.name: trace
    for trace in (
        PublishedTrace(
            "azure-conv", "Microsoft Azure (Azure/AzurePublicDataset)",
            _github("Azure/AzurePublicDataset", _AZURE_COMMIT, "data/AzureLLMInferenceTrace_conv.csv"),
            "sha256:2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719_188,
            "CC-BY-4.0", _SPLITWISE,
            ("AzureLLMInferenceTrace_conv.csv", "azure2023_conv.csv"),
        ),
        PublishedTrace(
            "azure-code", "Microsoft Azure (Azure/AzurePublicDataset)",
            _github("Azure/AzurePublicDataset", _AZURE_COMMIT, "data/AzureLLMInferenceTrace_code.csv"),
            "sha256:54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 320_117,
            "CC-BY-4.0", _SPLITWISE,
            ("AzureLLMInferenceTrace_code.csv", "azure2023_code.csv"),
        ),
        PublishedTrace(
            "mooncake-conversation", "Moonshot AI (kvcache-ai/Mooncake)",
            _github("kvcache-ai/Mooncake", _MOONCAKE_COMMIT, "FAST25-release/traces/conversation_trace.jsonl"),
            "sha256:b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533,
            "Apache-2.0", _MOONCAKE,
            ("conversation_trace.jsonl", "mooncake_fast25_conversation_trace.jsonl"),
        ),
        PublishedTrace(
            "mooncake-synthetic", "Moonshot AI (kvcache-ai/Mooncake)",
            _github("kvcache-ai/Mooncake", _MOONCAKE_COMMIT, "FAST25-release/traces/synthetic_trace.jsonl"),
            "sha256:bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 1_136_313,
            "Apache-2.0", _MOONCAKE,
            ("synthetic_trace.jsonl", "mooncake_fast25_synthetic_trace.jsonl"),
        ),
        PublishedTrace(
            "burstgpt", "HPMLL (HPMLL/BurstGPT)",
            _github("HPMLL/BurstGPT", _BURSTGPT_COMMIT, "data/BurstGPT_1.csv"),
            "git-blob-sha1:f95dd2c84454b067fdd0973858c55ecfe31bdad7", None,
            "CC-BY-4.0", 'Wang et al., "BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems", KDD 2025',
            ("BurstGPT_1.csv", "burstgpt1_first400.csv"),
        ),
        PublishedTrace(
            "llmservingsim-sharegpt", "KAIST CASYS (casys-kaist/LLMServingSim)",
            _github("casys-kaist/LLMServingSim", _LLMSERVINGSIM_COMMIT, "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl"),
            "sha256:05e48b32da530d4a3dd77f3d47c6fe694ac8308d611aa088e38bb10fba2b3b3a", 2_574_379,
            "MIT", 'Cho et al., "LLMServingSim: A HW/SW Co-Simulation Infrastructure for LLM Inference Serving at '
                   'Scale", IISWC 2024',
            ("sharegpt-llama-3.1-8b-300-sps10.jsonl", "llmservingsim_sharegpt_gpt4_llama31_300req.csv"),
        ),
        PublishedTrace(
            "sharegpt-8k", "Microsoft Research / project-etalon (Sarathi-Serve's processed ShareGPT)",
            _github("project-etalon/etalon", _ETALON_COMMIT,
                    "data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
            "sha256:6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f", 949_600,
            "Apache-2.0", 'Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", '
                          'OSDI 2024',
            ("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
        ),
        PublishedTrace(
            "arxiv", "Microsoft Research (microsoft/vidur)",
            _github("microsoft/vidur", _VIDUR_COMMIT,
                    "data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"),
            "sha256:9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc", 884_932,
            "MIT", 'Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024',
            ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
             "vidur_arxiv_summarization_stats_llama2_tokenizer.csv"),
        ),
        PublishedTrace(
            "bwb", "Microsoft Research / project-etalon (the file Vidur's configs name)",
            _github("project-etalon/etalon", _ETALON_COMMIT, "data/processed_traces/bwb_stats_llama2_tokenizer_filtered_v2.csv"),
            "sha256:389419d2f2e55149b5d6ccfedb881572798d39650436ab86fd61f3c40337a990", 1_123_791,
            "Apache-2.0", 'Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024',
            ("bwb_stats_llama2_tokenizer_filtered_v2.csv", "vidur_bwb_stats_llama2_tokenizer.csv"),
        ),
    )
}


def cache_dir() -> Path:
    """The folder ``kvlab workloads fetch`` saves traces in."""
    root = os.environ.get(CACHE_DIR_VARIABLE)
    if root:
        return Path(root).expanduser() / "traces"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kvlab" / "traces"


def traces_dir() -> Path | None:
    """``$KVLAB_TRACES_DIR`` as a folder, or None when it is unset; a value that is not a folder is refused."""
    value = os.environ.get(TRACES_DIR_VARIABLE)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise KvlabError(f"{TRACES_DIR_VARIABLE}={value!r} is not a folder; valid: a folder holding the published trace "
                         f"files (their names: docs/workloads.md), or unset it to use the cache {cache_dir()}")
    return path


@dataclass(frozen=True)
class Located:
    """Where a copy of a trace was found: its path and which of the three places it came from."""

    path: Path
    where: str  # "path", "KVLAB_TRACES_DIR" or "cache"


def trace_for_file(path: str | Path) -> PublishedTrace | None:
    """The published trace a user's file is a copy of, by its file name; None for any other file."""
    name = Path(path).name
    for trace in TRACES.values():
        if name in trace.filenames:
            return trace
    return None


def locate(name: str) -> Located | None:
    """Where a copy of trace ``name`` is: ``$KVLAB_TRACES_DIR`` first, then the cache; None when neither has one."""
    trace = TRACES[name]
    places = []
    folder = traces_dir()
    if folder is not None:
        places.append((folder, TRACES_DIR_VARIABLE))
    places.append((cache_dir(), "cache"))
    for place, where in places:
        for filename in trace.filenames:
            candidate = place / filename
            if candidate.is_file():
                return Located(candidate, where)
    return None


def how_to_get(name: str) -> str:
    """The one line that says a trace is absent, where it was looked for (under which file names) and how to get it:
    set KVLAB_TRACES_DIR only where it is unset (trial 55: it was advised while set to the folder searched)."""
    trace = TRACES[name]
    value = os.environ.get(TRACES_DIR_VARIABLE)
    folder = Path(value).expanduser() if value else None
    searched = (f"{TRACES_DIR_VARIABLE}={str(folder)!r} and " if folder is not None else "") + f"the cache {cache_dir()}"
    names = " or ".join(trace.filenames)
    instead = (f"or put the file in {folder}" if folder is not None else
               f"or set {TRACES_DIR_VARIABLE} to a folder holding it")
    return (f"the trace {name!r} is not on this machine (looked in {searched} for {names}): run `kvlab workloads "
            f"fetch {name}` to download it from its publisher, {instead}")


def require(name: str) -> Path:
    """The path of a copy of trace ``name``, or a KvlabError that says how to get one."""
    located = locate(name)
    if located is None:
        raise KvlabError(how_to_get(name))
    return located.path
