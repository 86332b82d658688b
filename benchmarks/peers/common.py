"""What the peer scripts share: the setup both sides run, kvlab's side of it, the figures and the tables.

The setup is Vidur's own default case, as the peers were measured against kvlab in issue 24: Llama-2-7B on one
A100-80GB, vLLM's scheduler with 7,424 blocks of 16 (what Vidur's memory planner gives: 29 requests of 4,096
tokens), at most 128 requests and 4,096 tokens per batch, no chunked prefill, 10,000 requests with ShareGPT
lengths (Sarathi-Serve's processed trace, the file Vidur's config names) clipped to 4,096 tokens, Poisson
arrivals (Vidur's generator, seed 42). kvlab runs on the `vidur-a100` profile (fitted to Vidur's profiling).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

NUM_REQUESTS = 10_000
NUM_GPU_BLOCKS = 7_424
BLOCK_SIZE = 16
MAX_NUM_SEQS = 128
MAX_NUM_BATCHED_TOKENS = 4_096
MAX_MODEL_LEN = 4_096
RATES = (1.58, 2.06)  # req/s: below kvlab's and Vidur's capacity on this setup, and at it
WATERMARK = 0.01  # V0's (and Vidur's) admission watermark, a fraction of the blocks
TRACE = "sharegpt-8k"
FIGURES = ("throughput_rps", "ttft_p50", "ttft_p99", "tpot_p50", "e2e_p50")


def cache_dir(override: str | None) -> Path:
    """Where the peers are installed (not in the repository): --cache, $KVLAB_PEERS_CACHE or ~/.cache/kvlab/peers."""
    path = Path(override or os.environ.get("KVLAB_PEERS_CACHE") or Path.home() / ".cache" / "kvlab" / "peers")
    path.mkdir(parents=True, exist_ok=True)
    return path


def trace_file() -> Path:
    """A copy of the published length trace, where kvlab finds one (KVLAB_TRACES_DIR, or the cache that
    `kvlab workloads fetch sharegpt-8k` fills)."""
    from kvlab.workload.published import require

    return require(TRACE)


def run(argv: list[str], *, cwd: Path | None = None, env: dict | None = None, log: Path | None = None) -> float:
    """Run a command, its output to ``log`` (or inherited); the seconds it took. Exits with its tail on failure."""
    start = time.perf_counter()
    with (log.open("w") if log else open(os.devnull, "w")) as out:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out if log else None,
                              stderr=subprocess.STDOUT if log else None)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log else ""
        sys.exit(f"failed (exit {proc.returncode}): {' '.join(map(str, argv))}\n{tail}")
    return seconds


def kvlab_run(requests_csv: Path, *, watermark: float = 0.0, chunked_prefill: bool = False) -> tuple[dict, float]:
    """kvlab's `vllm` strategy on Vidur's requests (a CSV of arrived_at, num_prefill_tokens, num_decode_tokens),
    in this process, through the run service: (the summary's figures, the seconds the simulation took)."""
    from kvlab import service
    from kvlab.config import resolve

    config = resolve(model="llama-2-7b", gpu="a100-80gb", num_gpu_blocks=NUM_GPU_BLOCKS, block_size=BLOCK_SIZE,
                     max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
                     max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, enable_chunked_prefill=chunked_prefill,
                     cost="vidur-a100", workload=str(requests_csv), arrival="trace", long_requests="clip",
                     watermark=watermark)
    start = time.perf_counter()
    summary = service.run(config, ["vllm"], record_iterations=False).summaries()[0]
    seconds = time.perf_counter() - start
    return {"throughput_rps": summary["throughput_rps"], "ttft_p50": summary["ttft_s"]["p50"],
            "ttft_p99": summary["ttft_s"]["p99"], "tpot_p50": summary["tpot_s"]["p50"],
            "e2e_p50": summary["e2e_latency_s"]["p50"], "preemptions": summary["preemptions"]}, seconds


def figures(arrival, ttft, e2e, num_output_tokens) -> dict:
    """Throughput, TTFT, TPOT and E2E as kvlab defines them (docs/metrics.md), from per-request arrays:
    throughput = finished / (last finish − first arrival), TPOT = (e2e − TTFT) / (output tokens − 1)."""
    import numpy as np

    from kvlab.metrics import distribution

    arrival, ttft, e2e, n = (np.asarray(x, dtype=float) for x in (arrival, ttft, e2e, num_output_tokens))
    several = n >= 2
    tpot = (e2e - ttft)[several] / (n[several] - 1)
    return {"throughput_rps": len(e2e) / float((arrival + e2e).max() - arrival.min()),
            "ttft_p50": distribution(ttft)["p50"], "ttft_p99": distribution(ttft)["p99"],
            "tpot_p50": distribution(tpot)["p50"], "e2e_p50": distribution(e2e)["p50"]}


def table(rows: dict[str, dict], reference: str) -> str:
    """A markdown table: one column per run (its figures), each beside ``reference``'s as a ratio."""
    names = list(rows)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key in (*FIGURES, "seconds"):
        cells = []
        for name in names:
            value = rows[name].get(key)
            ref = rows.get(reference, {}).get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("–")
                continue
            text = f"{value:.3f}" if key == "throughput_rps" else f"{value:.1f} s" if key == "seconds" else \
                f"{value * 1e3:,.0f} ms" if value < 10 else f"{value:,.1f} s"
            if name != reference and ref and key != "seconds":
                text += f" ({value / ref:.2f})"
            cells.append(text)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(out: Path, name: str, rows: dict, text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    (out / f"{name}.md").write_text(text + "\n")
