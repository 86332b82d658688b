"""`kvlab bench --compare` asks the engine what `kvlab run` asks it: one run service, every term of the cost profile
(its request latency, the time a request spends outside the engine, included). Issue 20: the comparison had left
a calibrated profile's request latency out."""

from __future__ import annotations

import csv

from fault_server import FaultServer, FaultState

from kvlab.bench.results import read_requests_csv
from kvlab.cost.profiles import write_profile
from kvlab.vllm.compare import TINY_MODEL_CONFIG

LATENCY_S = 0.25  # a calibrated profile's request latency, far above the tiny model's iterations
PROFILE = {"name": "calibrated", "kind": "absolute", "source": "a test's made-up constants", "model": "", "gpu": "",
           "constants": {"weights_read_s": 0.002, "context_token_s": 1e-6, "token_s": 1e-5, "attention_pair_s": 1e-9,
                         "overhead_s": 0.001, "seq_overhead_s": 1e-4, "prefill_token_overhead_s": 0.0,
                         "request_latency_s": LATENCY_S}}
ENGINE = ("--block-size", "32", "--num-gpu-blocks", "24", "--max-model-len", "512", "--max-num-seqs", "16",
          "--max-num-batched-tokens", "256")


def test_bench_compare_simulates_as_kvlab_run_does_request_latency_included(kvlab, tmp_path):
    profile = str(write_profile(PROFILE, tmp_path / "calibrated.toml"))
    workload = tmp_path / "workload.csv"
    workload.write_text("arrival_time,prompt_len,output_len\n" + "".join(
        f"{i * 0.03:.3f},{10 + 3 * i},{8 + i % 5}\n" for i in range(12)))
    out = tmp_path / "bench"
    with FaultServer(FaultState()) as server:
        bench = kvlab("bench", "--url", server.url, "-w", workload, "--arrival", "trace", "--compare", *ENGINE,
                      "--model-config", str(TINY_MODEL_CONFIG), "--cost", profile, "--out", out, "--json")
    assert bench.exit_code == 0, bench.stderr
    table = {row["figure"]: row["simulated"] for row in bench.json()["compare"]["table"]}

    # The same requests, each arriving when the bench sent it, through `kvlab run` under the same profile.
    sent = sorted((r for r in read_requests_csv(out / "requests.csv") if r["send_time"] is not None),
                  key=lambda r: (r["send_time"], r["request_id"]))
    replay = tmp_path / "sent.csv"
    with replay.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrival_time", "prompt_len", "output_len", "max_tokens"])
        for r in sent:
            writer.writerow([repr(r["send_time"]), r["prompt_len"], r["requested_output_tokens"],
                             r["requested_output_tokens"]])
    run = kvlab("run", "vllm", "-w", replay, "--arrival", "trace", *ENGINE, "--model", str(TINY_MODEL_CONFIG),
                "--cost", profile, "--json")
    assert run.exit_code == 0, run.stderr
    summary = run.json()["strategies"][0]
    for stat in ("mean", "p50", "p99"):
        assert table[f"TTFT {stat} (s)"] == summary["ttft_s"][stat], stat
        assert table[f"e2e latency {stat} (s)"] == summary["e2e_latency_s"][stat], stat
        assert table[f"TPOT {stat} (s)"] == summary["tpot_s"][stat], stat
    assert table["requests finished"] == summary["num_finished"] == 12
    # The request latency is in: no simulated request saw its first token sooner than that after it was sent.
    assert summary["ttft_s"]["p50"] >= LATENCY_S
    with (out / "simulated").glob("*requests*.csv").__next__().open() as f:
        ttfts = [float(row["ttft"]) for row in csv.DictReader(f) if row["ttft"]]
    assert min(ttfts) >= LATENCY_S
