"""Vidur (microsoft/vidur) and kvlab on the same 10,000 requests: speed and outputs, rerunnable.

    python benchmarks/peers/vidur.py                                        # kvlab's side alone; says what to pass
    python benchmarks/peers/vidur.py --vidur-python ~/vidur-env/bin/python  # vidur importable there
    python benchmarks/peers/vidur.py --vidur-dir ~/src/vidur                # a checkout, run by this interpreter
    python benchmarks/peers/vidur.py --vidur-python PY --kvlab-only         # Vidur's requests, kvlab's runs

Vidur is one the user already has (installed by Vidur's own README): an interpreter where `vidur` is importable
(--vidur-python) and the checkout it comes from, with its data/profiling (--vidur-dir; default: the folder the
interpreter's `vidur` package sits in). This script installs nothing. It:
1. requests: Vidur's own request generator (synthetic: ShareGPT lengths from the trace its config names, clipped
   to 4,096 tokens; Poisson arrivals; seed 42) writes the requests it will simulate, arrived_at,
   num_prefill_tokens, num_decode_tokens (kvlab reads these columns as they are); without Vidur, kvlab's stand-in
   (common.requests_csv: the same trace, clipping and rate, kvlab's draws);
2. Vidur: `python -m vidur.main` with its vLLM scheduler (V0's: prefills in batches of their own, a 1% admission
   watermark, a batch's tokens counted as requests × the longest), in its checkout; its CPU time measured; its
   request_metrics.csv read (Vidur's simulation needs data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/
   attention.csv, which a clone of its repository has; PyPI's `vidur` 0.0.26 is another code base);
3. kvlab: the same requests through kvlab's `vllm` strategy on `--cost vidur-a100`, vLLM V1's rules (the default),
   then with V0's watermark (`watermark=0.01`), then with chunked prefill; CPU time, in this process.
The tables (markdown and JSON) go to --out and stdout. Vidur's figures are computed as kvlab's (common.figures),
from its per-request times. Measured against Vidur at 7d47513 (issue 24). Bad input (a path that does not exist,
an interpreter that cannot import vidur, a checkout without it): one line, exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MODEL, DEVICE = "meta-llama/Llama-2-7b-hf", "a100"
ATTENTION_PROFILE = f"data/profiling/compute/{DEVICE}/{MODEL}/attention.csv"

# Vidur writes the requests its generator draws (run by Vidur's interpreter, in its checkout).
DUMP_REQUESTS = """
import csv, sys
from vidur.config import SimulationConfig
from vidur.request_generator.request_generator_registry import RequestGeneratorRegistry
from vidur.utils.random import set_seeds
out = sys.argv.pop(1)
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)  # (as vidur.main does before building the simulator and its generator)
generator = RequestGeneratorRegistry.get(config.request_generator_config.get_type(), config.request_generator_config)
with open(out, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
    for r in generator.generate():
        w.writerow([repr(r.arrived_at), r.num_prefill_tokens, r.num_decode_tokens])
"""


def vidur_args(rate: float, output_dir: Path, watermark: float = common.WATERMARK) -> list[str]:
    return [
        "--replica_config_model_name", MODEL, "--replica_config_device", DEVICE,
        "--replica_config_tensor_parallel_size", "1", "--replica_config_num_pipeline_stages", "1",
        "--cluster_config_num_replicas", "1",
        "--replica_scheduler_config_type", "vllm",
        "--vllm_scheduler_config_batch_size_cap", str(common.MAX_NUM_SEQS),
        "--vllm_scheduler_config_block_size", str(common.BLOCK_SIZE),
        "--vllm_scheduler_config_num_blocks", str(common.NUM_GPU_BLOCKS),
        "--vllm_scheduler_config_max_tokens_in_batch", str(common.MAX_NUM_BATCHED_TOKENS),
        "--vllm_scheduler_config_watermark_blocks_fraction", str(watermark),
        "--request_generator_config_type", "synthetic",
        "--synthetic_request_generator_config_num_requests", str(common.NUM_REQUESTS),
        "--length_generator_config_type", "trace",
        "--trace_request_length_generator_config_trace_file", str(common.trace_file()),
        "--trace_request_length_generator_config_max_tokens", str(common.MAX_MODEL_LEN),
        "--interval_generator_config_type", "poisson",
        "--poisson_request_interval_generator_config_qps", str(rate),
        "--metrics_config_output_dir", str(output_dir),
        "--no-metrics_config_enable_chrome_trace", "--no-metrics_config_store_plots",
    ]


def vidur_at(python: Path | None, checkout: Path | None) -> tuple[Path, Path] | None:
    """(the interpreter, the checkout) Vidur runs with, checked; None when neither is given."""
    if python is None and checkout is None:
        return None
    given = python
    python = common.executable(python, "--vidur-python") if python is not None else Path(sys.executable)
    if checkout is not None:
        checkout = common.directory(checkout, "--vidur-dir")
        if not (checkout / "vidur" / "main.py").is_file():
            common.fail(f"--vidur-dir {checkout}: no vidur/main.py there (give the folder of a Vidur checkout)")
        return python, checkout
    where = subprocess.run([str(python), "-c", "import os, vidur; print(os.path.dirname(os.path.dirname("
                            "os.path.abspath(vidur.__file__))))"], capture_output=True, text=True, env=vidur_env())
    if where.returncode != 0:
        common.fail(f"--vidur-python {given}: cannot import vidur (give the interpreter Vidur is installed in, or "
                    "--vidur-dir its checkout)")
    return python, Path(where.stdout.strip())


def vidur_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "WANDB_MODE": "disabled", "PYTHONPATH": ""}


def requests_of(python: Path, src: Path, rate: float, out: Path) -> Path:
    path = out / f"requests-{rate:g}.csv"
    common.run([str(python), "-c", DUMP_REQUESTS, str(path), *vidur_args(rate, out / "scratch")], cwd=src,
               env=vidur_env(), log=out / f"requests-{rate:g}.log")
    return path


def run_vidur(python: Path, src: Path, rate: float, out: Path, watermark: float) -> dict:
    output_dir = out / f"vidur-{rate:g}-watermark{watermark:g}"
    times = common.run([str(python), "-m", "vidur.main", *vidur_args(rate, output_dir, watermark)], cwd=src,
                       env=vidur_env(), log=out / f"vidur-{rate:g}-watermark{watermark:g}.log")
    metrics = max(output_dir.glob("*/request_metrics.csv"), key=lambda p: p.stat().st_mtime)
    with metrics.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(float(r["Request Id"])))
    return {**_vidur_figures(rows), **times}


def _vidur_figures(rows: list[dict]) -> dict:
    """Vidur's request_metrics.csv as kvlab's figures: arrival from the inter-arrival delays (the first request
    at 0), TTFT = prefill_e2e_time, E2E = request_e2e_time, output tokens = request_num_decode_tokens."""
    import numpy as np

    gaps = [float(r["request_inter_arrival_delay"] or 0.0) for r in rows]
    return common.figures(np.cumsum(gaps), [float(r["prefill_e2e_time"]) for r in rows],
                          [float(r["request_e2e_time"]) for r in rows],
                          [int(float(r["request_num_decode_tokens"])) for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vidur-python", type=Path, help="an interpreter where vidur is importable "
                        "[default: with --vidur-dir, this one; without either, kvlab's side alone]")
    parser.add_argument("--vidur-dir", type=Path, help="Vidur's checkout, with its data/ [default: where "
                        "--vidur-python finds vidur]")
    parser.add_argument("--rates", default=",".join(map(str, common.RATES)), help="req/s, comma-separated [default: %(default)s]")
    parser.add_argument("--out", type=Path, help="where the requests and tables go "
                        "[default: $KVLAB_PEERS_OUT or ~/.cache/kvlab/peers]")
    parser.add_argument("--kvlab-only", action="store_true", help="Vidur's requests and kvlab's runs, not Vidur's")
    args = parser.parse_args()
    if args.kvlab_only and args.vidur_python is None and args.vidur_dir is None:
        common.fail("--kvlab-only runs kvlab on Vidur's requests, which a Vidur draws: pass --vidur-python PATH or "
                    "--vidur-dir DIR with it (without any of the three, kvlab's side alone on its stand-in requests)")
    rates = common.rates(args.rates)
    vidur = vidur_at(args.vidur_python, args.vidur_dir)
    if vidur is not None and not args.kvlab_only and not (vidur[1] / ATTENTION_PROFILE).is_file():
        common.fail(f"{vidur[1] / ATTENTION_PROFILE} is missing: Vidur's simulation needs its checkout's "
                    "data/profiling (--kvlab-only runs the rest)")
    out = common.out_dir(args.out)
    if vidur is None:
        print("Vidur not given: kvlab's side alone, on kvlab's stand-in requests. Pass --vidur-python PATH (an "
              "interpreter where vidur is importable, installed as Vidur's README says) or --vidur-dir DIR (its "
              "checkout).\n")
    for rate in rates:
        if vidur is not None:
            requests, what = requests_of(*vidur, rate, out), "Vidur's requests"
        else:
            requests, what = common.requests_csv(rate, out)
        rows: dict[str, dict] = {}
        if vidur is not None and not args.kvlab_only:
            rows["Vidur"] = run_vidur(*vidur, rate, out, common.WATERMARK)
            rows["Vidur, no watermark"] = run_vidur(*vidur, rate, out, 0.0)
        for name, options in (("kvlab (V1)", {}), ("kvlab, watermark 0.01", {"watermark": common.WATERMARK}),
                              ("kvlab, chunked prefill", {"chunked_prefill": True})):
            rows[name] = common.kvlab_run(requests, **options)
        reference = next(iter(rows))
        text = (f"{what}, {common.NUM_REQUESTS:,} at {rate:g} req/s (Llama-2-7B, A100-80GB, "
                f"{common.NUM_GPU_BLOCKS:,} blocks of {common.BLOCK_SIZE}); ratios to {reference}:\n\n"
                + common.table(rows, reference))
        common.write(out, f"vidur-{rate:g}", rows, text)
        print(text + f"\n(written to {out / f'vidur-{rate:g}'}.md and .json)\n")


if __name__ == "__main__":
    main()
