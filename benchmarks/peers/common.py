"""What the peer scripts share: the setup both sides run, kvlab's side of it, the figures and the tables.

The setup is Vidur's own default case, as the peers were measured against kvlab in issue 24: Llama-2-7B on one
A100-80GB, vLLM's scheduler with 7,424 blocks of 16 (what Vidur's memory planner gives: 29 requests of 4,096
tokens), at most 128 requests and 4,096 tokens per batch, no chunked prefill, 10,000 requests with ShareGPT
lengths (Sarathi-Serve's processed trace, the file Vidur's config names) clipped to 4,096 tokens, Poisson
arrivals (Vidur's generator, seed 42, where a Vidur is given; else kvlab's stand-in: ``requests_csv``). kvlab runs
on the `vidur-a100` profile (fitted to Vidur's profiling).

A peer is a command the user already has (installed by the peer's own instructions); these scripts only convert
inputs, run it, convert its outputs and print kvlab's side beside it, CPU time (``time.process_time`` for kvlab,
the child's user + system time for the peer) and wall time. A path that does not exist or is not what it should be
is one line and exit status 2 (``fail``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Case:
    """One of issue 34's five cases: ``num_requests`` at ``rate`` req/s a replica, served by ``replicas`` behind
    ``router`` (kvlab's name; ``blis_router`` the peer's for the same rule)."""

    name: str
    what: str
    num_requests: int = NUM_REQUESTS
    replicas: int = 1
    router: str = "round-robin"
    blis_router: str = "round-robin"


# The cases issue 34's table measured, one instance and fleets. A fleet serves its requests at replicas x the rate,
# the load per replica of the lone instance. kvlab's least-requests and BLIS's least-loaded route to the replica with
# the fewest requests waiting, running or routed (BLIS's EffectiveLoad); ties: kvlab the lowest index, BLIS at random.
CASES = {case.name: case for case in (
    Case("one", "one instance, 10,000 requests"),
    Case("one-100k", "one instance, 100,000 requests", num_requests=100_000),
    Case("rr4", "4 replicas, round-robin", replicas=4),
    Case("ll4", "4 replicas, least-loaded", replicas=4, router="least-requests", blis_router="least-loaded"),
    Case("ll8", "8 replicas, least-loaded", replicas=8, router="least-requests", blis_router="least-loaded"),
)}


def cases(text: str) -> list[Case]:
    """``--cases`` as given: names from CASES, comma-separated; or one line and exit 2, before anything runs."""
    chosen = []
    for part in (p.strip() for p in text.split(",")):
        if part not in CASES:
            fail(f"--cases {text!r}: {part!r} is not a case; valid: {', '.join(CASES)}, comma-separated")
        if part not in chosen:
            chosen.append(part)
    return [CASES[name] for name in chosen]


def fail(message: str) -> None:
    """Bad input: one line, exit status 2."""
    print(f"{Path(sys.argv[0]).name}: {message}", file=sys.stderr)
    sys.exit(2)


def rates(text: str, flag: str = "--rates") -> list[float]:
    """``text`` as given to ``flag``: request rates, comma-separated, each a number > 0 and at most 1,000 req/s; or
    one line and exit 2, before anything runs."""
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            value = float("nan")
        if not 0 < value <= 1000:  # (nan fails too)
            fail(f"{flag} {text!r}: {part.strip()!r} is not a rate; valid: requests per second, numbers > 0 and "
                 "<= 1000, comma-separated (e.g. 1.58,2.06)")
        values.append(value)
    return values


def executable(path: Path, flag: str) -> Path:
    """``path`` as given to ``flag``: an executable file the user installed, or one line and exit 2."""
    if not path.exists():
        fail(f"{flag} {path}: no such file")
    if not path.is_file() or not os.access(path, os.X_OK):
        fail(f"{flag} {path}: not an executable file")
    return path.resolve()


def directory(path: Path, flag: str) -> Path:
    if not path.is_dir():
        fail(f"{flag} {path}: " + ("a file, not a folder" if path.exists() else "no such folder"))
    return path.resolve()


def out_dir(override: Path | None) -> Path:
    """Where the requests and tables go (not in the repository): --out, $KVLAB_PEERS_OUT or ~/.cache/kvlab/peers."""
    path = Path(override or os.environ.get("KVLAB_PEERS_OUT") or Path.home() / ".cache" / "kvlab" / "peers")
    path.mkdir(parents=True, exist_ok=True)
    return path


def trace_file() -> Path:
    """A copy of the published length trace, where kvlab finds one (KVLAB_TRACES_DIR, or the cache that
    `kvlab workloads fetch sharegpt-8k` fills)."""
    from kvlab.workload.published import require

    return require(TRACE)


def requests_csv(rate: float, folder: Path, num_requests: int = NUM_REQUESTS) -> tuple[Path, str]:
    """The ``num_requests`` requests at ``rate`` both sides run, and what they are: Vidur's generator's draws where
    vidur.py wrote them (requests-RATE.csv, 10,000 requests), else kvlab's stand-in (requests-RATE.kvlab.csv, or
    requests-RATE-nN.kvlab.csv for another count; written once): the same trace, clipping and rate, kvlab's Poisson
    draws (seed 42), not Vidur's."""
    vidur = folder / f"requests-{rate:g}.csv"
    if num_requests == NUM_REQUESTS and vidur.is_file():
        return vidur, "Vidur's requests"
    count = "" if num_requests == NUM_REQUESTS else f"-n{num_requests}"
    path = folder / f"requests-{rate:g}{count}.kvlab.csv"
    if not path.is_file():
        from kvlab.workload import load_workload

        workload = load_workload(str(trace_file()), num_requests=num_requests, rate=rate, arrival="poisson", seed=42,
                                 max_model_len=MAX_MODEL_LEN, long_requests="clip")
        with path.open("w") as f:
            f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
            for r in workload.requests:
                f.write(f"{r.arrival_time!r},{r.prompt_len},{r.num_output_tokens}\n")
    return path, "kvlab's stand-in requests (not Vidur's draws: vidur.py with Vidur writes those)"


def run(argv: list[str], *, cwd: Path | None = None, env: dict | None = None, log: Path | None = None) -> dict:
    """Run a peer's command, its output to ``log`` (or inherited): {"cpu_s": its CPU time (user + system, its
    children's included), "wall_s"}. Exits with its tail on failure."""
    import resource

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    cpu, start = children_cpu(), time.perf_counter()
    with (log.open("w") if log else open(os.devnull, "w")) as out:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out if log else None,
                              stderr=subprocess.STDOUT if log else None)
    times = {"cpu_s": children_cpu() - cpu, "wall_s": time.perf_counter() - start}
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log else ""
        sys.exit(f"failed (exit {proc.returncode}): {' '.join(map(str, argv))}\n{tail}")
    return times


def engine_line() -> str:
    """Which kvlab engine runs kvlab's side (its CPU time depends on it)."""
    import kvlab

    return (f"kvlab's engine: {kvlab.engine()}"
            + ("" if kvlab.engine().startswith("compiled") else " (benchmarks/README.md: how to compile it)"))


def kvlab_run(requests: Path, *, watermark: float = 0.0, chunked_prefill: bool = False, replicas: int = 1,
              router: str = "round-robin") -> dict:
    """kvlab's `vllm` strategy on Vidur's requests (a CSV of arrived_at, num_prefill_tokens, num_decode_tokens),
    in this process, through the run service, on one engine or ``replicas`` behind ``router``: the summary's
    figures (the fleet's, for several), and the run's CPU and wall time (reading the requests included)."""
    from kvlab import service
    from kvlab.config import resolve

    config = resolve(model="llama-2-7b", gpu="a100-80gb", num_gpu_blocks=NUM_GPU_BLOCKS, block_size=BLOCK_SIZE,
                     max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS,
                     max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, enable_chunked_prefill=chunked_prefill,
                     cost="vidur-a100", workload=str(requests), arrival="trace", long_requests="clip",
                     watermark=watermark, replicas=replicas, router=router)
    cpu, start = time.process_time(), time.perf_counter()
    summary = service.run(config, ["vllm"], record_iterations=False).summaries()[0]
    times = {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - start}
    return {"throughput_rps": summary["throughput_rps"], "ttft_p50": summary["ttft_s"]["p50"],
            "ttft_p99": summary["ttft_s"]["p99"], "tpot_p50": summary["tpot_s"]["p50"],
            "e2e_p50": summary["e2e_latency_s"]["p50"], "preemptions": summary["preemptions"], **times}


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
    for key in (*FIGURES, "cpu_s", "wall_s"):
        cells = []
        for name in names:
            value = rows[name].get(key)
            ref = rows.get(reference, {}).get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("–")
                continue
            text = f"{value:.3f}" if key == "throughput_rps" else f"{value:.2f} s" if key in ("cpu_s", "wall_s") else \
                f"{value * 1e3:,.0f} ms" if value < 10 else f"{value:,.1f} s"
            if name != reference and ref:
                text += f" ({value / ref:.2f})"
            cells.append(text)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(out: Path, name: str, rows: dict, text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    (out / f"{name}.md").write_text(text + "\n")
