"""Fit kvlab's matmul and bandwidth efficiencies to Vidur's published linear-layer profiling (the `vidur-*` profiles).

The data: Vidur's repository (https://github.com/microsoft/vidur, MIT licence), its files
data/profiling/compute/<gpu>/<org>/<model>/mlp.csv, CUDA-timed per-layer operations (QKV and output projections,
gated MLP, norms, rotary, activation, residual add) for several models, token counts 1-4096 and tensor-parallel
degrees 1-8. Nothing of it is committed to kvlab: clone it and point this script at the clone:

    git clone --depth 1 https://github.com/microsoft/vidur /tmp/vidur
    python scripts/fit_vidur.py /tmp/vidur [--write]

For each row (a model, a TP degree, a token count) the measured time of one decoder layer without attention is the
sum of the operations' medians; kvlab's roofline for the same layer is

    max(linear_params × 2 bytes / (peak bandwidth × bandwidth_efficiency),
        2 × linear_params × num_tokens / (peak FLOP/s × flops_efficiency))

fitted by least squares on the log of the ratio (each row counts alike, small and large batches), with scipy.
--write writes src/kvlab/cost/data/vidur-<gpu>.toml with the fit and its residuals in the profile's [fit] table.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

# Vidur's device names -> kvlab's catalogue GPU (Vidur profiles the SXM 80 GB parts).
GPUS = {"a100": "A100-80GB", "h100": "H100-SXM"}
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
BYTES_PER_PARAM = 2  # Vidur profiles fp16
DECODE_SIZED, PREFILL_SIZED = 32, 1024  # tokens: well below and well above the roofline's ridge


def linear_params(row: dict) -> float:
    """Parameters of one layer's linear operations on one TP worker (Vidur's columns)."""
    n_embd, n_head, n_kv = int(row["n_embd"]), int(row["n_head"]), int(row["n_kv_head"])
    n_expanded, tp = int(row["n_expanded_embd"]), int(row["num_tensor_parallel_workers"])
    head_dim = n_embd // n_head
    gated = row["use_gated_mlp"].strip().lower() == "true"
    qkv = n_embd * (n_head + 2 * n_kv) * head_dim
    out = n_embd * n_embd
    mlp = n_embd * n_expanded * (3 if gated else 2)
    return (qkv + out + mlp) / tp


def read_rows(vidur: Path, device: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    files = sorted((vidur / "data/profiling/compute" / device).glob("*/*/mlp.csv"))
    if not files:
        sys.exit(f"no data/profiling/compute/{device}/*/*/mlp.csv under {vidur}: clone github.com/microsoft/vidur")
    params, tokens, seconds, models = [], [], [], []
    for file in files:
        for row in csv.DictReader(file.open()):
            if row["num_tensor_parallel_workers"] != "1":
                continue
            params.append(linear_params(row))
            tokens.append(int(row["num_tokens"]))
            # (phi-2 runs attention and MLP in parallel off one norm: no post_attention_layernorm)
            seconds.append(sum(float(row[f"time_stats.{op}.median"]) for op in LAYER_OPS
                               if f"time_stats.{op}.median" in row) / 1e3)
        models.append(f"{file.parent.parent.name}/{file.parent.name}")
    return np.array(params), np.array(tokens, dtype=float), np.array(seconds), models


def fit(device: str, vidur: Path) -> dict:
    from kvlab.catalog import get_gpu

    gpu = get_gpu(GPUS[device])
    params, tokens, measured, models = read_rows(vidur, device)
    t_read = params * BYTES_PER_PARAM / gpu.memory_bandwidth_bytes_per_s
    t_flops = 2 * params * tokens / gpu.peak_flops

    def predicted(x):
        return np.maximum(t_read / x[0], t_flops / x[1])

    # Each efficiency where its resource bounds the time by a wide margin (the ridge is near 150 tokens on both
    # GPUs): near the ridge both matter and a roofline's max is known to undershoot, which would bias both.
    memory_rows, compute_rows = tokens <= DECODE_SIZED, tokens >= PREFILL_SIZED
    x, sigma = [], []
    for t_model, rows in ((t_read, memory_rows), (t_flops, compute_rows)):
        result = least_squares(lambda e, t=t_model, m=rows: np.log(t[m] / e[0] / measured[m]), x0=[0.5],
                               bounds=([0.01], [1.0]))
        dof = max(1, int(rows.sum()) - 1)
        cov = np.linalg.inv(result.jac.T @ result.jac) * float(result.fun @ result.fun) / dof
        x.append(float(result.x[0]))
        sigma.append(float(np.sqrt(cov[0, 0])))
    ratio = predicted(x) / measured - 1

    def band(mask) -> dict:
        r = ratio[mask]
        return {"rows": int(mask.sum()), "median_error": float(np.median(r)), "rms_error": float(np.sqrt(np.mean(r**2))),
                "worst_error": float(r[np.argmax(np.abs(r))])}

    return {
        "device": device, "gpu": gpu.id, "models": models, "rows": len(measured),
        "bandwidth_efficiency": x[0], "bandwidth_efficiency_sigma": sigma[0],
        "flops_efficiency": x[1], "flops_efficiency_sigma": sigma[1],
        "all": band(tokens > 0), "decode_sized": band(memory_rows), "ridge": band(~memory_rows & ~compute_rows),
        "prefill_sized": band(compute_rows),
    }


def profile(f: dict) -> dict:
    bw, fl = round(f["bandwidth_efficiency"], 3), round(f["flops_efficiency"], 3)
    pct = lambda x: f"{100 * x:+.1f}%"
    source = (
        f"Fitted by scripts/fit_vidur.py to Vidur's published linear-layer profiling on {f['gpu']} "
        f"(github.com/microsoft/vidur, data/profiling/compute/{f['device']}/*/*/mlp.csv, TP 1: {f['rows']} rows, "
        f"{len(f['models'])} models, 1-4096 tokens; one decoder layer without attention): bandwidth_efficiency "
        f"{bw} ± {f['bandwidth_efficiency_sigma']:.3f} on batches of <= {DECODE_SIZED} tokens, flops_efficiency "
        f"{fl} ± {f['flops_efficiency_sigma']:.3f} on >= {PREFILL_SIZED}. kvlab's roofline against Vidur's rows: "
        f"decode-sized median {pct(f['decode_sized']['median_error'])} (rms {f['decode_sized']['rms_error']:.0%}), "
        f"prefill-sized {pct(f['prefill_sized']['median_error'])} (rms {f['prefill_sized']['rms_error']:.0%}), near "
        f"the ridge {pct(f['ridge']['median_error'])} (rms {f['ridge']['rms_error']:.0%}: there both resources "
        f"matter and a roofline's max undershoots). Not fitted: attention (Vidur's attention.csv is not in the "
        f"snapshot this fit read), so its efficiencies are the matmuls'; no CPU overhead (Vidur's default has none): "
        f"0 s per iteration, per sequence and per prefill token."
    )
    return {
        "name": f"vidur-{f['device']}", "kind": "efficiency", "source": source, "gpu": f["gpu"],
        "constants": {"bandwidth_efficiency": bw, "attention_bandwidth_efficiency": bw, "flops_efficiency": fl,
                      "attention_flops_efficiency": fl, "overhead_s": 0.0, "seq_overhead_s": 0.0,
                      "prefill_token_overhead_s": 0.0, "request_latency_s": 0.0},
        "fit": {"data": f"github.com/microsoft/vidur data/profiling/compute/{f['device']}/*/*/mlp.csv",
                "models": f["models"], "rows": f["rows"],
                "bandwidth_efficiency_sigma": round(f["bandwidth_efficiency_sigma"], 4),
                "flops_efficiency_sigma": round(f["flops_efficiency_sigma"], 4),
                **{f"{k}_{m}": round(f[k][m], 4) for k in ("all", "decode_sized", "ridge", "prefill_sized")
                   for m in ("median_error", "rms_error", "worst_error")}},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vidur", type=Path, help="a clone of github.com/microsoft/vidur")
    parser.add_argument("--write", action="store_true", help="write src/kvlab/cost/data/vidur-<gpu>.toml")
    args = parser.parse_args()
    from kvlab.cost.profiles import write_profile

    for device in GPUS:
        f = fit(device, args.vidur)
        print(json.dumps({k: v for k, v in f.items() if k != "models"}, indent=1))
        if args.write:
            out = Path(__file__).resolve().parents[1] / f"src/kvlab/cost/data/vidur-{device}.toml"
            print("wrote", write_profile(profile(f), out))


if __name__ == "__main__":
    main()
