"""BLIS (inference-sim/inference-sim, Go) and kvlab on the same requests: speed and outputs, rerunnable.

    python benchmarks/peers/blis.py                                   # kvlab's side alone; says what to pass
    python benchmarks/peers/blis.py --blis ~/src/inference-sim/blis   # a BLIS you built, beside kvlab
    python benchmarks/peers/blis.py --blis /usr/local/bin/blis --blis-configs ~/src/inference-sim
    python benchmarks/peers/blis.py --cases one-100k,ll8              # some of issue 34's five cases

The cases (common.CASES, issue 34's table): one instance on 10,000 requests at each --rates; one instance on
100,000; 4 replicas round-robin; 4 and 8 replicas least-loaded (kvlab's least-requests), each fleet at replicas x
the first rate, the lone instance's load per replica.

BLIS is a command the user already has (built from its repository as BLIS's own README says); this script
installs nothing. It:
1. takes the requests at each rate (common.requests_csv: Vidur's draws where vidur.py wrote them, else kvlab's
   stand-in) and writes them as a BLIS TraceV2 (a header YAML and a data CSV of arrival times and token counts);
2. runs the given `blis replay` with its roofline latency model on an A100-80, the same pool (7,424 blocks of 16),
   at most 128 requests and 4,096 tokens a step, no chunked prefill (long-prefill-token-threshold 0), with the
   model config and hardware config of its repository (--blis-configs: the folder holding model_configs/ and
   hardware_config.json; default: the binary's folder); its CPU time measured;
3. reads its per-request results (ttft_us, e2e_us) as kvlab's figures (common.figures), beside kvlab's side on the
   same requests (CPU time, in this process).
A fleet case runs `blis replay --num-instances N --routing-policy P` with `--snapshot-refresh-interval 0`: its
router reads each instance's live state, as kvlab's does (BLIS's default reads a 50 ms old snapshot).
The one-instance conversion was measured against BLIS v0.7.15 (issue 24); the fleet flags are v0.7.15's, not run
against a BLIS here (none installed). Bad input (a path that does not exist, is not executable, a configs
folder without BLIS's files): one line, exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MODEL = "meta-llama/llama-2-7b-hf"  # BLIS ships its config.json (model_configs/llama-2-7b-hf)
MODEL_CONFIG = Path("model_configs") / "llama-2-7b-hf"
HARDWARE_CONFIG = "hardware_config.json"
TRACE_COLUMNS = ("request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index", "prefix_group",
                 "prefix_length", "streaming", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
                 "audio_tokens", "video_tokens", "reason_ratio", "model", "deadline_us", "server_input_tokens",
                 "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "num_chunks",
                 "status", "error_message", "finish_reason")


def blis_configs(binary: Path, given: Path | None) -> Path:
    """The folder of BLIS's model and hardware configs (its repository's root), checked."""
    folder = common.directory(given, "--blis-configs") if given is not None else binary.parent
    for needed in (folder / MODEL_CONFIG, folder / HARDWARE_CONFIG):
        if not needed.exists():
            flag = f"--blis-configs {given}" if given is not None else f"--blis {binary}: its folder"
            common.fail(f"{flag}: no {needed.relative_to(folder)} there; give BLIS's repository folder as --blis-configs")
    return folder


def write_trace(requests: Path, out: Path) -> tuple[Path, Path, list[float]]:
    """The requests (arrived_at, num_prefill_tokens, num_decode_tokens) as a TraceV2 (BLIS's
    sim/workload/tracev2.go): header YAML, data CSV; and their arrivals (s)."""
    with requests.open(newline="") as f:
        rows = list(csv.DictReader(f))
    header, data = out / f"{requests.stem}.trace.yaml", out / f"{requests.stem}.trace.csv"
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


def blis_argv(binary: Path, configs: Path, header: Path, data: Path, results: Path, case: common.Case) -> list[str]:
    """``blis replay`` on the trace with the setup's engine (common.py), as ``case`` asks: one instance, or a fleet
    whose router reads live state."""
    argv = [str(binary), "replay", "--trace-header", str(header), "--trace-data", str(data),
            "--model", MODEL, "--latency-model", "roofline", "--hardware", "A100-80", "--tp", "1",
            "--model-config-folder", str(configs / MODEL_CONFIG), "--hardware-config", str(configs / HARDWARE_CONFIG),
            "--total-kv-blocks", str(common.NUM_GPU_BLOCKS), "--block-size-in-tokens", str(common.BLOCK_SIZE),
            "--max-num-seqs", str(common.MAX_NUM_SEQS), "--max-num-batched-tokens", str(common.MAX_NUM_BATCHED_TOKENS),
            "--long-prefill-token-threshold", "0", "--results-path", str(results)]
    if case.replicas > 1:
        argv += ["--num-instances", str(case.replicas), "--routing-policy", case.blis_router,
                 "--snapshot-refresh-interval", "0"]
    return argv


def blis_figures(results: Path, arrivals: list[float]) -> dict:
    """BLIS's per-request results (a JSON list of SimResult: request_id, ttft_us, e2e_us, output_tokens) as kvlab's
    figures; a request missing from them is not counted (BLIS writes the finished ones)."""
    by_id = {int(r["request_id"]): r for r in json.loads(results.read_text())}
    done = sorted(by_id)
    return common.figures([arrivals[i] for i in done], [by_id[i]["ttft_us"] / 1e6 for i in done],
                          [by_id[i]["e2e_us"] / 1e6 for i in done], [by_id[i]["output_tokens"] for i in done])


def run_blis(binary: Path, configs: Path, requests: Path, out: Path, case: common.Case) -> dict:
    header, data, arrivals = write_trace(requests, out)
    results = out / f"blis-{case.name}-{requests.stem}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    times = common.run(blis_argv(binary, configs, header, data, results, case), cwd=configs, env=env,
                       log=out / f"blis-{case.name}-{requests.stem}.log")
    return {**blis_figures(results, arrivals), **times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blis", type=Path, help="BLIS's binary, as you built or installed it [default: kvlab's side "
                        "alone]")
    parser.add_argument("--blis-configs", type=Path, help="the folder holding BLIS's model_configs/ and "
                        "hardware_config.json (its repository) [default: the binary's folder]")
    parser.add_argument("--rates", default=",".join(map(str, common.RATES)), help="req/s, comma-separated: the "
                        "one-instance case at each, the others at the first, a replica [default: %(default)s]")
    parser.add_argument("--cases", default=",".join(common.CASES), help="which of issue 34's cases, "
                        "comma-separated [default: %(default)s]")
    parser.add_argument("--requests", type=Path, help="the folder of the requests (vidur.py's --out) [default: OUT]")
    parser.add_argument("--out", type=Path, help="where the trace, BLIS's results and the tables go "
                        "[default: $KVLAB_PEERS_OUT or ~/.cache/kvlab/peers]")
    args = parser.parse_args()
    rates = common.rates(args.rates)
    chosen = common.cases(args.cases)
    binary = common.executable(args.blis, "--blis") if args.blis is not None else None
    configs = blis_configs(binary, args.blis_configs) if binary is not None else None
    requests_dir = common.directory(args.requests, "--requests") if args.requests is not None else None
    out = common.out_dir(args.out)
    print(common.engine_line())
    if binary is None:
        print("BLIS not given: kvlab's side alone. Pass --blis PATH (BLIS's binary, built as its README says) and, "
              "unless the binary sits in BLIS's repository folder, --blis-configs DIR.\n")
    for case in chosen:
        for rate in rates if case.name == "one" else rates[:1]:
            offered = rate * case.replicas
            requests, what = common.requests_csv(offered, requests_dir or out, case.num_requests)
            rows = {"kvlab (V1)": common.kvlab_run(requests, replicas=case.replicas, router=case.router)}
            if binary is not None and configs is not None:
                rows = {"BLIS (roofline, its defaults)": run_blis(binary, configs, requests, out, case), **rows}
            reference = next(iter(rows))
            name = f"blis-{case.name}-{rate:g}"
            text = (f"{case.what}: {what}, {case.num_requests:,} at {offered:g} req/s ({requests}), through "
                    f"{'BLIS and ' if binary is not None else ''}kvlab"
                    + (f"; ratios to {reference}" if len(rows) > 1 else "") + ":\n\n"
                    + common.table(rows, reference))
            common.write(out, name, rows, text)
            print(text + f"\n(written to {out / name}.md and .json)\n", flush=True)


if __name__ == "__main__":
    main()
