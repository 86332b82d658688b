"""Vidur (microsoft/vidur) and kvlab on the same 10,000 requests: speed and outputs, rerunnable.

    python benchmarks/peers/vidur.py                      # install Vidur (once), run both at 1.58 and 2.06 req/s
    python benchmarks/peers/vidur.py --rates 2.06 --out out/peers
    python benchmarks/peers/vidur.py --source ~/src/vidur # a clone you already have (offline)

What it does, each step in its own environment under the cache folder (--cache, $KVLAB_PEERS_CACHE or
~/.cache/kvlab/peers; nothing in the repository):
1. install: `git clone https://github.com/microsoft/vidur` at VIDUR_COMMIT (or copy --source), a virtual
   environment of its own, `pip install -r requirements.txt` (numpy, pandas, scikit-learn, wandb, ... from PyPI).
   Vidur reads its GPU profiling from its repository's data/profiling (the A100's attention.csv is ~5 MB); PyPI's
   `vidur` (0.0.26) is another code base that downloads its profiles from Hugging Face at run time, so it is not
   used.
2. requests: Vidur's own request generator (synthetic: ShareGPT lengths from the trace its config names, clipped
   to 4,096 tokens; Poisson arrivals; seed 42) writes the requests it will simulate, arrived_at,
   num_prefill_tokens, num_decode_tokens (kvlab reads these columns as they are);
3. Vidur: `python -m vidur.main` with its vLLM scheduler (V0's: prefills in batches of their own, a 1% admission
   watermark, a batch's tokens counted as requests × the longest); timed; its request_metrics.csv read;
4. kvlab: the same requests through kvlab's `vllm` strategy on `--cost vidur-a100`, vLLM V1's rules (the default),
   then with V0's watermark (`watermark=0.01`), then with chunked prefill; timed.
The tables (markdown and JSON) go to --out (default: the cache folder's vidur/results) and stdout. Vidur's figures
are computed as kvlab's (common.figures), from its per-request times.

Offline, a user needs: a clone of microsoft/vidur at VIDUR_COMMIT with its data/ folder (--source), and its
requirements as wheels (pip's --find-links or a local index).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

VIDUR_URL = "https://github.com/microsoft/vidur"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"  # main on 2024-11 (issue 24's measurements)
MODEL, DEVICE = "meta-llama/Llama-2-7b-hf", "a100"
ATTENTION_PROFILE = f"data/profiling/compute/{DEVICE}/{MODEL}/attention.csv"

# Vidur writes the requests its generator draws (run inside Vidur's venv, from its source folder).
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


def install(home: Path, source: Path | None) -> Path:
    """Vidur's source folder and venv under ``home``; once (a marker file says it finished)."""
    src, venv = home / "src", home / "venv"
    marker = home / "installed"
    if marker.is_file() and marker.read_text().strip() == VIDUR_COMMIT:
        return venv / "bin" / "python"
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    if source is not None:
        shutil.copytree(source, src, ignore=shutil.ignore_patterns(".git", "simulator_output", "cache"))
    else:
        common.run(["git", "clone", "--quiet", VIDUR_URL, str(src)], log=home / "clone.log")
        common.run(["git", "-C", str(src), "checkout", "--quiet", VIDUR_COMMIT], log=home / "clone.log")
    common.run([sys.executable, "-m", "venv", str(venv)], log=home / "install.log")
    common.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(src / "requirements.txt")],
               log=home / "install.log")
    marker.write_text(VIDUR_COMMIT + "\n")
    return venv / "bin" / "python"


def vidur_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "WANDB_MODE": "disabled", "PYTHONPATH": ""}


def requests_of(python: Path, src: Path, rate: float, out: Path) -> Path:
    path = out / f"requests-{rate:g}.csv"
    common.run([str(python), "-c", DUMP_REQUESTS, str(path), *vidur_args(rate, out / "scratch")], cwd=src,
               env=vidur_env(), log=out / f"requests-{rate:g}.log")
    return path


def run_vidur(python: Path, src: Path, rate: float, out: Path, watermark: float) -> dict:
    if not (src / ATTENTION_PROFILE).is_file():
        sys.exit(f"{src / ATTENTION_PROFILE} is missing: Vidur's simulation needs its repository's data/profiling "
                 f"(a clone of {VIDUR_URL} has it); --kvlab-only runs the rest")
    output_dir = out / f"vidur-{rate:g}-watermark{watermark:g}"
    seconds = common.run([str(python), "-m", "vidur.main", *vidur_args(rate, output_dir, watermark)], cwd=src,
                         env=vidur_env(), log=out / f"vidur-{rate:g}-watermark{watermark:g}.log")
    metrics = next(output_dir.glob("*/request_metrics.csv"))
    with metrics.open(newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: int(float(r["Request Id"])))
    return {**_vidur_figures(rows), "seconds": seconds}


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
    parser.add_argument("--rates", default=",".join(map(str, common.RATES)), help="req/s, comma-separated")
    parser.add_argument("--cache", help="install folder [default: $KVLAB_PEERS_CACHE or ~/.cache/kvlab/peers]")
    parser.add_argument("--source", type=Path, help="a local clone of microsoft/vidur (with data/) to install from")
    parser.add_argument("--out", type=Path, help="where the tables go [default: CACHE/vidur/results]")
    parser.add_argument("--kvlab-only", action="store_true", help="Vidur's requests and kvlab's runs, not Vidur's")
    args = parser.parse_args()
    home = common.cache_dir(args.cache) / "vidur"
    out = args.out or home / "results"
    out.mkdir(parents=True, exist_ok=True)
    python = install(home, args.source)
    for rate in (float(r) for r in args.rates.split(",")):
        requests = requests_of(python, home / "src", rate, out)
        rows: dict[str, dict] = {}
        if not args.kvlab_only:
            rows["Vidur"] = run_vidur(python, home / "src", rate, out, common.WATERMARK)
            rows["Vidur, no watermark"] = run_vidur(python, home / "src", rate, out, 0.0)
        for name, options in (("kvlab (V1)", {}), ("kvlab, watermark 0.01", {"watermark": common.WATERMARK}),
                              ("kvlab, chunked prefill", {"chunked_prefill": True})):
            figures, seconds = common.kvlab_run(requests, **options)
            rows[name] = {**figures, "seconds": seconds}
        text = (f"Vidur's {common.NUM_REQUESTS:,} requests at {rate:g} req/s (Llama-2-7B, A100-80GB, "
                f"{common.NUM_GPU_BLOCKS:,} blocks of {common.BLOCK_SIZE}); ratios to "
                f"{'Vidur' if 'Vidur' in rows else 'kvlab (V1)'}:\n\n"
                + common.table(rows, "Vidur" if "Vidur" in rows else "kvlab (V1)"))
        common.write(out, f"vidur-{rate:g}", rows, text)
        print(text + "\n")


if __name__ == "__main__":
    main()
