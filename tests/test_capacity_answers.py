"""The pieces of a capacity answer a planner reads (issue 31): dollars at the answer, the two samples' spread, a
target no rate meets, `vllm` as `vllm serve`, latencies in readable units, the engine defaults in words."""

from __future__ import annotations

import json
import math
import re

import pytest

from kvlab.errors import KvlabError


def test_serving_cost_is_the_gpus_hour_over_the_output_tokens_it_serves():
    from kvlab.catalog.prices import GpuPrice, serving_cost

    cost = serving_cost(GpuPrice(2.0, "given", "test"), 3, 1.0, 500.0)
    assert cost["usd_per_hour"] == 6.0
    assert cost["usd_per_million_output_tokens"] == pytest.approx(6.0 / (1.0 * 500 * 3600) * 1e6)  # $3.33
    assert serving_cost(GpuPrice(2.0, "given", "test"), 1, 0.0, 500.0)["usd_per_million_output_tokens"] is None


def test_catalogue_prices_have_a_date_and_a_source_and_an_override_wins():
    from kvlab.catalog.prices import PRICES, gpu_hour_price

    for price in PRICES.values():
        assert price.usd_per_gpu_hour > 0 and price.as_of and "http" not in price.source and "." in price.source
    assert gpu_hour_price("H100-SXM").usd_per_gpu_hour == PRICES["H100-SXM"].usd_per_gpu_hour
    assert gpu_hour_price("a100_80gb") is PRICES["A100-80GB"]
    assert gpu_hour_price("T4") is None
    assert gpu_hour_price("H100-SXM", 1.5).usd_per_gpu_hour == 1.5


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_price_that_is_not_a_positive_number_is_refused(bad):
    from kvlab.catalog.prices import gpu_hour_price

    with pytest.raises(KvlabError, match="--gpu-hour-price .*: a GPU-hour's price in US dollars must be a positive"):
        gpu_hour_price("H100-SXM", bad)


def test_a_bad_price_is_one_line_before_anything_runs(kvlab, tmp_path):
    r = kvlab("capacity", "--gpu-hour-price", "-2", "--out", tmp_path / "c")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--gpu-hour-price -2" in r.stderr and not (tmp_path / "c").exists()


def test_the_second_sample_is_twice_the_workload_and_the_spread_names_the_length_that_would_do():
    from kvlab.sweep.capacity import length_for_spread, longer_sample, sample_spread, samples_text

    assert longer_sample({"num_requests": 1300, "duration": None})["num_requests"] == 2600
    assert longer_sample({"num_requests": None, "duration": 60.0})["duration"] == 120.0
    # a trace with its own arrival times: the whole trace (its later stretches may be heavier), up to the limit
    assert longer_sample({"num_requests": 1300, "duration": None}, rows=19_366)["num_requests"] == 19_366
    assert longer_sample({"num_requests": 1300, "duration": None}, rows=2_700)["num_requests"] == 2_700
    assert longer_sample({"num_requests": 1300, "duration": None}, rows=10**6)["num_requests"] == 100_000
    assert longer_sample({"num_requests": 60_000, "duration": None}, rows=10**6)["num_requests"] == 120_000
    assert sample_spread(19.0, 17.5) == pytest.approx(19 / 17.5 - 1)
    assert sample_spread(0.0, 3.0) is None
    assert length_for_spread(2600, 0.05) is None  # within 10%: stable
    assert length_for_spread(2600, 0.20) == 10400  # 2,600 × (0.2 / 0.1)²
    assert "stable" in samples_text((1300, 2600), ("19", "18.5"), 19 / 18.5 - 1, "req/s")
    moving = samples_text((1300, 2600), ("19", "15"), 19 / 15 - 1, "req/s")
    assert "the answer moves with the sample" in moving and "about 18,500 requests" in moving  # 2,600 × (0.267 / 0.1)²
    whole = samples_text((1300, 19_366), ("25", "15"), 25 / 15 - 1, "req/s", whole_trace=True)
    assert whole == ("on 1,300 requests 25 req/s, on 19,366 15, the whole trace (spread 67%: the trace's beginning is "
                     "not like the whole of it; the answer is the lower); each rate is --rate's, the whole trace's "
                     "mean with its own arrivals rescaled to it: its first 1,300 arrive at their own pace within it")
    # (trial 54, finding 2: a first sample too short for a steady state is said to be so, not blamed on the trace)
    assert whole == samples_text((1300, 19_366), ("25", "15"), 25 / 15 - 1, "req/s", whole_trace=True, steady=640)
    short = samples_text((50, 100), ("150", "112"), 150 / 112 - 1, "req/s", whole_trace=True, steady=640)
    assert short.startswith("on 50 requests 150 req/s, on 100 112, the whole trace (spread 34%: the first sample's 50 "
                            "requests are too few to reach a steady state (which takes about 640); the answer is the "
                            "lower)") and "beginning" not in short
    unloaded = samples_text((200, 400), ("512", "30"), 512 / 30 - 1, "req/s", whole_trace=True, steady=115,
                            first_uncertified="no rate tried failed")
    assert ("the first sample's 200 requests are too few to reach a steady state (its own answer is not certified: no "
            "rate tried failed); the answer is the lower") in unloaded and "beginning" not in unloaded
    assert whole == samples_text((1300, 19_366), ("25", "15"), 25 / 15 - 1, "req/s", whole_trace=True, steady=640,
                                 first_uncertified=None)


def _failing(search, rate: float, value: float, waiting: float = 0.0):
    from kvlab.sweep.slo import Verdict

    search.record(rate, value, False, Verdict(False, {"p99_ttft<1s": value}, None, f"missed p99_ttft<1s ({value} s)"),
                  {"state": "stable", "oldest_wait_second_half_s": waiting})


def test_a_search_stops_halving_when_the_latency_has_reached_its_floor():
    from kvlab.sweep.capacity import Search

    search = Search(start_rate=4.0)
    _failing(search, 4.0, 3.0, waiting=2.0)
    assert search.next_rate() == 2.0 and search.unreachable is None
    _failing(search, 2.0, 1.3)
    assert search.next_rate() == 1.0 and search.unreachable is None  # 3.0 -> 1.3: halving still helps
    _failing(search, 1.0, 1.21)
    assert search.next_rate() == 0.5  # 1.3 -> 1.21: 7%
    _failing(search, 0.5, 1.205)
    assert search.next_rate() is None and search.capacity == 0.0
    assert search.unreachable.startswith("missed p99_ttft<1s (1.205 s) even at 0.5 req/s, with nothing waiting")
    queued = Search(start_rate=1.0)
    _failing(queued, 1.0, 1.21, waiting=0.5)
    _failing(queued, 0.5, 1.21, waiting=0.5)
    assert queued.unreachable is None and queued.next_rate() == 0.25  # (something waits: a lower rate may help)


def test_vllm_is_vllm_serve_with_prefix_caching_and_the_paper_s_has_none():
    from kvlab.strategies import PAPER_SYSTEMS, behaviour, parse_strategy

    assert parse_strategy("vllm").enable_prefix_caching
    assert behaviour(parse_strategy("vllm")) == behaviour(parse_strategy("vllm+prefix"))
    assert behaviour(parse_strategy("vllm+noprefix")) == behaviour(parse_strategy("continuous+paged"))
    assert behaviour(parse_strategy("vllm-paper")) == behaviour(parse_strategy("continuous+paged"))
    assert "vllm-paper" in PAPER_SYSTEMS and "vllm" not in PAPER_SYSTEMS
    with pytest.raises(KvlabError, match="names \\+prefix and \\+noprefix"):
        parse_strategy("vllm+prefix+noprefix")
    with pytest.raises(KvlabError, match="prefix caching needs paged memory"):
        parse_strategy("orca-max+prefix")


def test_latency_cells_switch_to_seconds_from_ten_seconds():
    from kvlab.report.text import latency_cell

    assert latency_cell(2293.104) == "2,293 s"  # (the "2,293,104 ms")
    assert latency_cell(12.3) == "12.3 s"
    assert latency_cell(9.99) == "9,990 ms"
    assert latency_cell(0.0873) == "87.3 ms"
    assert latency_cell(None) == "–"


def test_the_engine_defaults_that_change_an_answer_are_in_words():
    from kvlab.config import resolve
    from kvlab.report.setup import engine_defaults_text, engine_setup, setup_lines
    from kvlab.strategies import parse_strategy

    strategies = [parse_strategy("vllm"), parse_strategy("orca-max")]
    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", tensor_parallel_size=2)
    text = engine_defaults_text([config.describe()], strategies)
    assert text == (f"max_num_seqs {config.scheduler.max_num_seqs:,}, max_num_batched_tokens "
                    f"{config.scheduler.max_num_batched_tokens:,}, max_model_len {config.scheduler.max_model_len:,}, "
                    "chunked prefill on, prefix caching on for vllm, off for orca-max")
    lines = setup_lines({**config.describe(), **engine_setup(config, strategies)})
    assert any(line.startswith("parallel: TP 2: two all-reduces") and "NVLink" in line for line in lines)
    assert any("prefix caching on for vllm, off for orca-max" in line for line in lines)


def test_a_race_where_every_strategy_falls_behind_says_so(kvlab):
    r = kvlab("race", "-n", "300")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "Every strategy is overloaded at the offered" in text and "Each served, over the whole run (its start and drain included, when it was not full: below what it sustains full): static+max" in text
    assert "chunked prefill on, prefix caching off" in text
    calm = " ".join(kvlab("race", "-n", "300", "--rate", "0.2").stdout.split())
    assert "Every strategy is overloaded" not in calm


def test_a_run_of_one_engine_that_falls_behind_says_so_without_race_words(kvlab):
    """Trial 47 #14: kvlab run with one strategy said 'Every strategy ... this race compares engines falling behind'."""
    text = " ".join(kvlab("run", "continuous+paged+swap", "--swap-space", "8", "-n", "200").stdout.split())
    assert "continuous+paged+swap is overloaded at the offered rate" in text and "it served " in text
    assert "Every strategy" not in text and "race" not in text


def test_docs_sweep_defines_sustained_two_samples_and_dollars_with_the_code_s_worked_example():
    """docs/sweep.md (issue 31): the definition of sustained, the two samples and their spread, the cost model, and
    a worked example whose dollars are kvlab.catalog.prices.serving_cost's at the catalogue's price (the command
    that printed it is written beside it)."""
    import re
    from pathlib import Path

    from kvlab.catalog.prices import gpu_hour_price, serving_cost
    from kvlab.sweep.capacity import STABLE_SPREAD

    text = " ".join((Path(__file__).parents[1] / "docs" / "sweep.md").read_text().split())
    for said in ("**Sustained.** The engine **keeps up** when its waiting queue", "**Latency is not a signal**",
                 "### Two samples", "**spread** (the higher over the lower, less 1)",
                 f"Two samples within {STABLE_SPREAD:.0%}", "### Which clock, and what it costs",
                 "usd_per_hour = gpu_hour_price × GPUs (TP × PP × replicas)",
                 "usd_per_million_output_tokens = usd_per_hour / (rate × mean output tokens × 3,600) × 10⁶",
                 'kvlab capacity --strategy vllm,orca-max --model llama-3.1-8b --gpu h100-sxm --slo "p99_ttft<2s"'):
        assert said in text, said
    example = re.search(r"vllm under vllm-h100 holds ([\d.]+) req/s[^;]*; one H100 costs \$([\d.]+) an "
                        r"hour; the workload's mean answer is (\d+) tokens, so it serves .*? = ([\d.]+) million output "
                        r"tokens an hour: \$[\d.]+ / [\d.]+ = \$([\d.]+) per million", text)
    assert example is not None
    rate, price, mean, millions, per_million = (float(g) for g in example.groups())
    catalogue = gpu_hour_price("H100-SXM")
    assert price == catalogue.usd_per_gpu_hour
    assert round(rate * mean * 3600 / 1e6, 1) == millions
    digits = len(example.group(5).partition(".")[2])  # (as many decimals as the doc writes)
    assert round(serving_cost(catalogue, 1, rate, mean)["usd_per_million_output_tokens"], digits) == per_million


def test_the_lead_clock_standing_apart_from_every_other_is_measured():
    """The lead clock more than twice from every other clock's answer: how far (below < 1, above > 1); within a
    factor of two of any other, or alone, or with a zero answer: None."""
    from kvlab.service.capacity import lead_apart

    assert lead_apart({"roofline": 21.0, "vidur-h100": 26.0, "vllm-h100": 0.687}, "vllm-h100") == 0.687 / 21.0
    assert lead_apart({"roofline": 2.0, "vidur-h100": 9.0, "vllm-h100": 20.0}, "vllm-h100") == 20.0 / 9.0
    assert lead_apart({"roofline": 21.0, "vidur-h100": 26.0, "vllm-h100": 11.0}, "vllm-h100") is None  # (21: 1.9x)
    assert lead_apart({"vllm-h100": 0.5}, "vllm-h100") is None
    assert lead_apart({"roofline": 0.0, "vllm-h100": 0.5}, "vllm-h100") is None


def test_the_cost_per_million_tokens_is_priced_on_the_answers_of_the_sample_that_gave_the_rate(kvlab, tmp_path):
    from kvlab.workload import load_workload

    r = kvlab("capacity", "-n", "150", "--cost", "roofline", "--strategy", "vllm", "--gpu-hour-price", "2",
              "--out", tmp_path / "c", "--json")
    assert r.exit_code == 0, r.stderr
    found = r.json()["capacities"][0]
    samples, cost = found["samples"], found["serving_cost"]
    # (here the longer sample, 300 requests, holds the lower rate; its answers are not the first 150's)
    assert samples["capacities"][1] < samples["capacities"][0] and cost["rate_rps"] == samples["capacities"][1]
    requests = load_workload("paper-sharegpt", num_requests=300, rate=1.0, seed=0).requests
    mean = sum(q.num_output_tokens for q in requests) / len(requests)
    assert cost["mean_output_tokens"] == pytest.approx(mean)
    assert cost["usd_per_million_output_tokens"] == pytest.approx(2.0 / (cost["rate_rps"] * mean * 3600) * 1e6)
    # Trial 49: what limited the answer is the answering sample's, and the line says which (here the 300's)
    text = " ".join(kvlab("capacity", "-n", "150", "--cost", "roofline", "--strategy", "vllm", "--gpu-hour-price",
                          "2", "--out", tmp_path / "c").stdout.split())
    assert "limited by: vllm under roofline (on 300 requests): " in text


def test_a_run_too_short_to_load_the_engine_is_not_called_overloaded(kvlab):
    """Trial 47/48: `kvlab run static+paged+prefix -n 5` was called overloaded on two arrivals in its window."""
    text = " ".join(kvlab("run", "static+paged+prefix", "-n", "5").stdout.split())
    assert "overloaded" not in text
    m = re.search(r"window \(after the first 20% of arrivals\) held (\d+) arrivals, fewer than the 10 a window needs "
                  r"to measure a queue; -n ([\d,]+) puts twice the engine's seats \((\d+)\) in the window", text)
    assert m is not None, text
    arrived, needed, seats = int(m[1]), int(m[2].replace(",", "")), int(m[3])
    assert arrived < 10 and 2 * seats < needed
    longer = " ".join(kvlab("run", "static+paged+prefix", "-n", str(needed)).stdout.split())
    assert "Too short to judge" not in longer and "static+paged+prefix is overloaded at the offered rate" in longer


def test_a_run_says_what_its_preemptions_cost(kvlab):
    """Trial 48: a +swap run showed no swap traffic in its table (only --json had swapped_bytes)."""
    swap = kvlab("run", "continuous+paged+swap", "--swap-space", "8", "-n", "200")
    data = json.loads(kvlab("run", "continuous+paged+swap", "--swap-space", "8", "-n", "200", "--json").stdout)
    s = data["strategies"][0]
    assert s["swapped_bytes"] > 0 and s["preemptions"] > 0
    text = " ".join(swap.stdout.split())
    assert (f"Preemptions: continuous+paged+swap {s['preemptions']:,} ({s['swapped_bytes'] / 2**30:,.1f} GiB swapped "
            "between GPU and CPU memory, out and back in)." in text)
    race = kvlab("race", "vllm", "-n", "300", "--json")
    v = json.loads(race.stdout)["strategies"][0]
    text = " ".join(kvlab("race", "vllm", "-n", "300").stdout.split())
    assert f"Preemptions: vllm {v['preemptions']:,} ({v['recomputed_tokens']:,} tokens computed again)." in text


def test_a_rate_failed_as_backlogged_says_by_how_many_requests_the_queue_grew():
    # (trial 53, finding 13: "throughput: backlogged" over a queue of 0 → 2 read as the GPU running out)
    from kvlab.sweep.capacity import Search
    from kvlab.sweep.slo import Verdict

    search = Search(start_rate=2.0)
    search.record(2.5, 0.03, True, None, {"state": "stable"})
    reason = "backlogged: queue count grew (queue 0 → 2 waiting, oldest wait 0.0061 s → 0.54 s)"
    search.record(2.562, 0.04, False, Verdict(False, {}, None, reason),
                  {"state": "backlogged", "queue_first_half": 0.2, "queue_second_half": 2.25, "num_arrived": 169})
    assert search.limited_by == (f"throughput: {reason} at 2.562 req/s (the queue grew by about 2 requests over the "
                                 "window's 169 arrivals: small, but growing, so a longer run would wait ever longer; "
                                 "the latency target may still hold on this short one)")
