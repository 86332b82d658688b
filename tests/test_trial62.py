"""Trial 62's findings 1 and 2 (an operator of a fleet): an overloaded run's req/s is what it served over the whole
run, its start and drain included, not the most it serves; a gateway that admits less than is offered is where the
queue grows."""

from __future__ import annotations

from kvlab import service
from kvlab.config import resolve


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_an_overloaded_runs_rate_grows_with_its_length_so_it_is_not_called_the_most_it_serves(kvlab):
    # The same engine, overloaded at 60 req/s: the run's req/s over its makespan rises with -n (its start and drain
    # weigh less), so it is below what the engine sustains full, never an upper bound.
    rates = []
    for n in (300, 1000):
        config = resolve(model="llama-3.1-8b", gpu="h100-sxm", workload="azure-conv", rate=60, num_requests=n)
        run = service.run(config, ["vllm"], record_iterations=False)
        assert run.overloaded()[1] == [True]
        rates.append(run.summaries()[0]["throughput_rps"])
    assert rates[1] > rates[0] * 1.1, rates
    text = _flat(kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "azure-conv",
                       "--rate", "60", "-n", "300").stdout)
    assert "at most" not in text, text
    assert (f"it served {rates[0]:.3g} req/s over the whole run (its start and drain included, when it was not full: "
            "below what it sustains full)") in text, text
    assert "; overloaded, it served " in text and " req/s over this run." in text


def test_a_gateway_below_the_offered_rate_is_where_the_queue_grows(kvlab):
    gated = _flat(kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-n", "300", "--rate", "30",
                        "--seed", "0", "--rate-limit", "20", "--gateway-queue", "1000").stdout)
    assert ("its waiting queue grows at the gateway, which admits at most 20 req/s (--rate-limit), whatever the "
            "engine's capacity: a run without --rate-limit shows the engine's)") in gated, gated
    assert "(at most the gateway's 20; its start and drain included)" in gated
    free = _flat(kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-n", "300", "--rate", "30",
                       "--seed", "0").stdout)
    assert "is overloaded" not in free and "gateway" not in free  # the engine alone keeps up at 30 req/s


def test_a_run_with_a_cpu_tier_says_what_the_tier_did(kvlab):
    """Trial 62, finding 8: the tier's hits, loads, stores and evictions were in --json only."""
    argv = ["run", "vllm+prefix", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "sessions",
            "--system-prompt-len", "1000", "--max-model-len", "16384", "--num-gpu-blocks", "3000", "-n", "300",
            "--rate", "4", "--kv-offloading-size", "8"]
    import json

    s = json.loads(kvlab(*argv, "--json").stdout)["strategies"][0]
    text = _flat(kvlab(*argv).stdout)
    assert (f"vllm+prefix: CPU tier served {s['cpu_prefix_hit_tokens']:,} prompt tokens from "
            f"{s['offload_loaded_blocks']:,} blocks loaded back ({s['offload_loaded_bytes'] / 2**30:.2f} GiB over the "
            f"host link), against {s['gpu_prefix_hit_tokens']:,} tokens hit on the GPU; over the run it stored "
            f"{s['offload_stored_blocks']:,} blocks") in text, text
    assert s["cpu_prefix_hit_tokens"] == 16 * s["offload_loaded_blocks"] > 0
    plain = _flat(kvlab(*argv[:-2]).stdout)
    assert "CPU tier" not in plain


def test_capacity_names_the_router_where_the_table_varies_it(kvlab, tmp_path):
    """Trial 62, finding 5: with two routers, the lines under the table all read "vllm"."""
    argv = ["capacity", "--strategy", "vllm", "--replicas", "2", "--router", "round-robin,least-requests", "-n", "200",
            "--slo", "p99_ttft<2s", "--workers", "1", "--gpu-hour-price", "2", "--out", str(tmp_path)]
    text = _flat(kvlab(*argv).stdout)
    for router in ("round-robin", "least-requests"):
        assert f"limited by: vllm, router {router} under roofline" in text, text
        assert f"vllm, router {router}: " in text
    import json

    cheapest = json.loads(kvlab(*argv, "--json").stdout)["cheapest"]
    assert f"Cheapest under the target: vllm, router {cheapest['configuration']['router']} at $" in text


def test_a_fleet_says_why_its_router_sent_each_request_where_it_did(kvlab):
    """Trial 62, finding 9a: a prefix router on a workload that shares no prefix said only "prefix hit rate 0.0%";
    it routed by load, as least-requests does, and now says so with its reasons' counts."""
    text = _flat(kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--replicas", "4", "--router",
                       "prefix", "--workload", "azure-conv", "--rate", "40", "-n", "300").stdout)
    assert "prefix hit rate 0.0%; requests routed per replica: " in text
    assert "; why: 300 no prefix cached: fewest requests." in text, text


def test_a_sweep_latency_column_keeps_three_digits_with_trailing_zeros():
    """Trial 62, finding 9d: the sweep's TTFT p99 column printed "6.6" beside "8.39"."""
    from kvlab.report.text import latency_column

    assert latency_column([8.39, 6.6, 5.75, 163.0, 7.52, None]) == ("s", ["8.39", "6.60", "5.75", "163", "7.52", "–"])
    assert latency_column([0.0722, 0.05, 0.112]) == ("ms", ["72.2", "50.0", "112"])
