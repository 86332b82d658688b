"""How fast the simulator runs: simulated requests and output tokens per second of wall time.

    python benchmarks/bench_sim.py            # the full run: 7,200 requests per strategy, then 1M through vllm
    python benchmarks/bench_sim.py --quick    # the 1M run replaced by 100k, extrapolated (labelled as such)
    python benchmarks/bench_sim.py --json     # the same numbers as JSON

The setup is issue 3's: OPT-13B on one A100-40GB with the paper's 12 GiB of KV cache
(``engine_config(model="opt-13b", gpu="a100-40gb", available_kv_gib=12)``, 15,728 slots), the ShareGPT
stand-in at 2 requests/s (``load_workload("paper-sharegpt", num_requests=N, rate=2.0, seed=0)``: 7,200 requests
are the paper's one-hour trace). Targets (issue 34): the lesson's four strategies on the 7,200 requests in under 0.5 s in all;
a million requests through ``vllm`` in under 20 s; time per request within 10% from 10k to 1M requests.
The first line names the engine that ran (pure Python, or compiled: ``KVLAB_COMPILE=1 pip install .``).

Each run is timed twice: wall time (``time.perf_counter``) and the process's CPU time (``time.process_time``),
which a busy shared machine inflates less. Workloads are built before the clock starts (building is reported on
its own line). The 7,200-request runs record the per-iteration log, as ``kvlab race`` does, and keep the best of
``--repeat`` runs; the large ones do not record it (``record_iterations=False``) and run once. A calibration
line (a fixed pure-Python loop) and the load average let numbers from different machines be compared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

LESSON = ("static+max", "continuous+max", "static+paged", "continuous+paged")
PAPER = ("orca-max", "orca-pow2", "orca-oracle", "vllm")


def engine_config(**options):
    """The engine's configuration for these options (kvlab.config.resolve's), also on a checkout of kvlab from
    before the front door (SimConfig.from_options), so that two versions can be timed with this one file."""
    try:
        from kvlab.config import resolve
    except ImportError:
        from kvlab.sim import SimConfig

        return SimConfig.from_options(**options)
    return resolve(options).engine


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def engine_name() -> str:
    """Which engine runs (kvlab.engine(): pure Python or compiled with mypyc; a checkout older than it: pure)."""
    import kvlab

    return kvlab.engine() if hasattr(kvlab, "engine") else "pure Python"


def calibrate() -> float:
    """Microseconds a fixed pure-Python loop takes here (about 0.3-0.4 on a recent desktop core)."""
    data = list(range(100))
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(20000):
            sum(data)
        best = min(best, (time.process_time() - start) / 20000 * 1e6)
    return best


def build(num_requests: int):
    from kvlab.workload import load_workload

    start = time.perf_counter()
    workload = load_workload("paper-sharegpt", num_requests=num_requests, rate=2.0, seed=0)
    return workload, time.perf_counter() - start


def run(name: str, config, workload, *, record_iterations: bool, repeat: int = 1) -> dict:
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy

    best = None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = Simulation(parse_strategy(name), config, workload, record_iterations=record_iterations).run()
        summary = result.summary()  # part of what a run costs: `kvlab race` prints it
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if best is None or wall < best["wall_s"]:
            best = {
                "strategy": name,
                "num_requests": workload.num_requests,
                "wall_s": wall,
                "cpu_s": cpu,
                "num_finished": result.counters.num_finished,
                "num_output_tokens": result.counters.num_output_tokens,
                "num_iterations": result.integral.num_iterations,
                "simulated_s": summary["makespan_s"],
            }
    best["requests_per_s"] = best["num_requests"] / best["wall_s"]
    best["tokens_per_s"] = best["num_output_tokens"] / best["wall_s"]
    best["us_per_request"] = best["wall_s"] / best["num_requests"] * 1e6
    best["cpu_us_per_request"] = best["cpu_s"] / best["num_requests"] * 1e6
    return best


def clipped(workload, max_model_len: int):
    """Vidur's proportional clip: a request whose prompt + output exceeds ``max_model_len`` keeps their ratio."""
    from dataclasses import replace

    from kvlab.workload import Workload

    requests = []
    for r in workload.requests:
        total = r.prompt_len + r.output_len
        if total > max_model_len:
            prompt_len = max(1, r.prompt_len * max_model_len // total)
            r = replace(r, prompt_len=prompt_len, output_len=max(1, max_model_len - prompt_len - 1))
        requests.append(r)
    return Workload(name=workload.name, requests=tuple(requests), description=workload.description,
                    source=workload.source)


def saturation(say) -> dict:
    """Light load against saturation on the setup run beside Vidur (issue 9): Llama-2-7B on an A100-80GB,
    7,424 blocks of 16, ShareGPT lengths clipped to 4,096, chunked prefill off, 10,000 requests at 1.5 req/s
    (below capacity) and 2.1 req/s (above it: the queue grows and preemptions recompute). Time per request at
    saturation over time per request at light load is the figure (target: at most 1.5)."""
    from kvlab.workload import load_workload

    config = engine_config(model="llama-2-7b", gpu="a100-80gb", num_gpu_blocks=7425, max_model_len=4096,
                           max_num_batched_tokens=4096, enable_chunked_prefill=False)
    say("\nlight load against saturation: llama-2-7b on a100-80gb, 7,424 blocks, sharegpt-8k clipped to 4,096, "
        "chunked prefill off, 10,000 requests, log off, best of 3:")
    rows = {}
    for rate in (1.5, 2.1):
        workload = clipped(load_workload("sharegpt-8k", num_requests=10_000, rate=rate, arrival="poisson", seed=0),
                           4096)
        row = run("vllm", config, workload, record_iterations=False, repeat=3)
        rows[str(rate)] = row
        say(f"  {rate} req/s: {row['cpu_us_per_request']:6.1f} µs cpu per request, {row['requests_per_s']:8,.0f} "
            f"requests/s, {row['num_iterations']:,} iterations")
    ratio = rows["2.1"]["cpu_us_per_request"] / rows["1.5"]["cpu_us_per_request"]
    say(f"  saturated / light load, cpu per request: {ratio:.2f} (target: at most 1.5: {met(ratio <= 1.5)})")
    return {"rows": rows, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=7200, help="requests per strategy (default: 7,200)")
    parser.add_argument("--large", type=int, default=1_000_000, help="requests of the large vllm run (default: 1M)")
    parser.add_argument("--quick", action="store_true", help="run the large run at 100k and extrapolate")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each 7,200-request strategy; the best counts")
    parser.add_argument("--strategies", default=",".join(LESSON + PAPER[:-1] + PAPER[-1:]),
                        help="comma-separated strategies timed on --requests (default: the lesson's and the paper's)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    from kvlab.errors import KvlabError
    from kvlab.strategies import parse_strategy

    for name in [n for n in args.strategies.split(",") if n]:
        try:
            parse_strategy(name)
        except KvlabError as error:
            parser.error(f"--strategies: {error}")

    config = engine_config(model="opt-13b", gpu="a100-40gb", available_kv_gib=12)
    report: dict = {
        "setup": "opt-13b on a100-40gb, 12 GiB KV cache "
                 f"({config.cache.num_slots:,} slots), paper-sharegpt at 2 req/s, seed 0",
        "python": sys.version.split()[0],
        "load_average": os.getloadavg(),
        "calibration_us": calibrate(),
        "engine": engine_name(),
    }
    out = sys.stdout if not args.json else open(os.devnull, "w")

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say(f"kvlab simulator benchmark: {report['setup']}")
    say(f"engine: {report['engine']}; python {report['python']}; load average {report['load_average'][0]:.2f}; calibration "
        f"{report['calibration_us']:.2f} µs (a recent desktop core: ~0.35)")

    # Per strategy, on the one-hour trace.
    workload, build_s = build(args.requests)
    names = [n for n in args.strategies.split(",") if n]
    say(f"\n{args.requests:,} requests ({build_s:.2f} s to build), per-iteration log on, best of {args.repeat}:")
    say(f"  {'strategy':<18} {'wall s':>7} {'cpu s':>7} {'requests/s':>11} {'tokens/s':>11} {'iterations':>11}")
    rows = []
    for name in names:
        row = run(name, config, workload, record_iterations=True, repeat=args.repeat)
        rows.append(row)
        say(f"  {name:<18} {row['wall_s']:7.3f} {row['cpu_s']:7.3f} {row['requests_per_s']:11,.0f} "
            f"{row['tokens_per_s']:11,.0f} {row['num_iterations']:11,}")
    report["strategies"] = rows
    lesson = [r for r in rows if r["strategy"] in LESSON]
    if len(lesson) == len(LESSON):
        wall = sum(r["wall_s"] for r in lesson)
        cpu = sum(r["cpu_s"] for r in lesson)
        report["lesson_total"] = {"wall_s": wall, "cpu_s": cpu, "target_s": 0.5}
        say(f"  lesson's four in all: {wall:.2f} s wall, {cpu:.2f} s cpu (target: under 0.5 s: {met(wall < 0.5)})")

    # A million requests through vllm (or 100k, extrapolated).
    large = 100_000 if args.quick else args.large
    workload, build_s = build(large)
    report["calibration_us"] = calibrate()  # again: the machine's speed just before the large run
    row = run("vllm", config, workload, record_iterations=False)
    scale = args.large / large
    row["extrapolated_to"] = args.large if scale != 1 else None
    row["wall_s_at_target_size"] = row["wall_s"] * scale
    report["large"] = row
    report["large_build_s"] = build_s
    label = (f"{large:,} requests, EXTRAPOLATED x{scale:g} to {args.large:,}" if scale != 1
             else f"{large:,} requests")
    say(f"\nvllm, {label} (log off; workload built in {build_s:.1f} s, not counted):")
    say(f"  {row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s cpu, {row['requests_per_s']:,.0f} requests/s, "
        f"{row['tokens_per_s']:,.0f} tokens/s, {row['num_iterations']:,} iterations")
    if scale != 1:
        say(f"  -> {row['wall_s_at_target_size']:.0f} s for {args.large:,} requests if time per request stays flat "
            f"(target: under 20 s: {met(row['wall_s_at_target_size'] < 20)})")
    else:
        say(f"  (target: under 20 s: {met(row['wall_s'] < 20)})" if args.large >= 1_000_000
            else "  (the target is a million requests under 20 s)")

    # Linearity: time per request as the run grows. A shared machine's speed drifts, so each size is also
    # given in units of the calibration loop measured just before it.
    sizes = [10_000, 30_000, 100_000] if args.quick else sorted({10_000, 100_000, args.large})
    say("\nlinearity, vllm, log off: time per request (and in calibration units, measured just before)")
    linearity = []
    for size in sizes:
        unit = calibrate()
        if size == large:
            point = row
            unit = report["calibration_us"]
        else:
            workload, _ = build(size)
            point = run("vllm", config, workload, record_iterations=False, repeat=3 if size <= 30_000 else 1)
        linearity.append({"num_requests": size, "us_per_request": point["us_per_request"],
                          "cpu_us_per_request": point["cpu_us_per_request"], "calibration_us": unit,
                          "calibration_units_per_request": point["cpu_us_per_request"] / unit})
        say(f"  {size:>9,} requests: {point['us_per_request']:6.1f} µs wall, {point['cpu_us_per_request']:6.1f} µs cpu"
            f" = {point['cpu_us_per_request'] / unit:5.0f} calibration units")
    report["linearity"] = linearity
    growth = linearity[-1]["calibration_units_per_request"] / linearity[0]["calibration_units_per_request"]
    report["linearity_growth"] = growth
    say(f"  {linearity[-1]['num_requests']:,} against {linearity[0]['num_requests']:,}: {growth:.2f}x per request in "
        f"calibration units (target: within 10%: {met(abs(growth - 1) <= 0.1)})")
    report["saturation"] = saturation(say)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
