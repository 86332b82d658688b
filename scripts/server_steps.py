"""What a vLLM server's steps cost in each bench, from its own log, beside what a cost profile says of the same
steps (the numbers of docs/cost.md, "Validation against the real vLLM server").

    python scripts/server_steps.py SERVER_LOG BENCH_DIR... [--cost PROFILE.toml]

SERVER_LOG is the log of a server started with --enable-logging-iteration-details, BENCH_DIR the folders of
``kvlab bench --out`` run against it (the test's are under pytest's tmp_path: test_cost_vllm.py). For each bench:
its steps, the part of a step outside the forward pass (a + b × requests, src/kvlab/cost/server_log.py), the
median and mean time of its decode-only steps by number of requests, how much of its time steps over 100 ms hold,
and, with --cost, the profile's time for the same steps, in total and by number of requests.

    python scripts/server_steps.py --probe 30

sleeps 5 ms at a time for 30 s and prints every wake-up more than 100 ms late: the machine's pauses, seen by a
process that does nothing else (run it beside a bench).
"""

from __future__ import annotations

import argparse
import time
import tomllib
from pathlib import Path

BINS = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 12), (12, 16))


def probe(seconds: float) -> None:
    start = last = time.perf_counter()
    late = []
    while last - start < seconds:
        time.sleep(0.005)
        now = time.perf_counter()
        if now - last > 0.1:
            late.append(f"{last - start:.2f} s: {now - last:.3f} s")
        last = now
    print(f"{len(late)} pauses over 100 ms in {seconds:g} s" + (": " + ", ".join(late) if late else ""))


def report(server_log: Path, benches: list[Path], cost: Path | None) -> None:
    import json

    import numpy as np

    from kvlab.cost.calibrate import predicted
    from kvlab.cost.server_log import bench_steps, read_steps

    constants = tomllib.loads(cost.read_text())["constants"] if cost else None
    steps = read_steps(server_log)
    for bench in benches:
        server = json.loads((bench / "summary.json").read_text())["server"]
        rows, a, b = bench_steps(bench, steps)
        prefilling, prefill_tokens, decoding, decode_tokens, elapsed, usage = np.asarray(rows, dtype=float).T
        num_seqs = prefilling + decoding
        context = np.maximum(0.0, usage * (server["num_gpu_blocks"] - 1) * server["block_size"]
                             - num_seqs * server["block_size"] / 2)
        step_s = elapsed + a + b * num_seqs
        model_s = predicted(constants, num_seqs, prefill_tokens, decode_tokens, context) if constants else None
        paused = step_s > 0.1
        print(f"{bench}: {len(rows)} steps, {step_s.sum():.2f} s; outside the forward pass {a * 1e3:.2f} ms + "
              f"{b * 1e3:.3f} ms/request; steps over 100 ms: {paused.sum()}, {step_s[paused].sum():.2f} s")
        if model_s is not None:
            print(f"  the profile's time for these steps: {model_s.sum():.2f} s ({model_s.sum() / step_s.sum() - 1:+.1%})")
        for lo, hi in BINS:
            m = (num_seqs > lo) & (num_seqs <= hi) & (prefilling == 0)
            if m.sum() > 5:
                size = f"{hi}" if hi == lo + 1 else f"{lo + 1}-{hi}"
                line = (f"  decode steps of {size} requests: {m.sum():4d}, median {np.median(step_s[m]) * 1e3:5.1f} "
                        f"ms, mean {step_s[m].mean() * 1e3:5.1f} ms (forward pass median {np.median(elapsed[m]) * 1e3:5.1f})")
                if model_s is not None:
                    line += f", profile {model_s[m].mean() * 1e3:5.1f} ms"
                print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("server_log", nargs="?", type=Path)
    parser.add_argument("benches", nargs="*", type=Path)
    parser.add_argument("--cost", type=Path, help="a profile file (kvlab calibrate --out)")
    parser.add_argument("--probe", type=float, metavar="SECONDS", help="only watch for the machine's pauses")
    args = parser.parse_args()
    if args.probe:
        probe(args.probe)
    elif args.server_log and args.benches:
        report(args.server_log, args.benches, args.cost)
    else:
        parser.error("give SERVER_LOG and BENCH_DIR..., or --probe SECONDS")


if __name__ == "__main__":
    main()
