"""Fix 56: user-facing leftovers of trial 55, each through the CLI."""

from __future__ import annotations

import re


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_capacity_says_its_latency_is_the_measured_windows(kvlab, tmp_path):
    """Trial 55, finding 8: capacity's "missed p99_ttft<2s (2.5 s)" is a window p99 (after the warm-up), which
    `kvlab run` at the same rate does not reproduce; the caption, the limit line and --help say so."""
    r = kvlab("capacity", "-n", "150", "--cost", "roofline", "--strategy", "vllm", "--slo", "p99_ttft<300ms",
              "--out", tmp_path / "c")
    assert r.exit_code == 0, r.stderr
    text = _flat(r.stdout)
    assert "Capacity: the highest rate sustained with p99_ttft<300ms (latencies over each run's measured window)" in text
    m = re.search(r"limited by: vllm under roofline \(on ([\d,]+) requests\): latency: missed p99_ttft<300ms "
                  r"\([\d.]+ m?s\) at ([\d.]+) req/s \(over that run's measured window: requests ([\d,]+)\.\.([\d,]+) "
                  r"by arrival, after a 20% warm-up; `kvlab run` reports all its requests\)\.", text)
    assert m, text
    total, first, last = (int(m[i].replace(",", "")) for i in (1, 3, 4))
    assert last == total and 1 < first < total  # (the warm-up's requests are left out, the last arrival is in)
    # the window's count is the stored run's: the JSON's probe at the failing rate says the same
    found = kvlab("capacity", "-n", "150", "--cost", "roofline", "--strategy", "vllm", "--slo", "p99_ttft<300ms",
                  "--out", tmp_path / "c", "--json").json()["capacities"][0]
    assert found["limited_by"].endswith(f"at {m[2]} req/s")
    helped = _flat(kvlab("capacity", "--help").stdout)
    assert "met the target in its measured window (after a 20% warm-up; the latencies shown are its)" in helped


def _race_row(text: str, name: str) -> list[str]:
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == name and len(cells) > 5:
            return [c for c in cells[1:] if c != "★"]
    raise AssertionError(f"no row for {name!r} in\n{text}")


def test_race_prints_per_token_latency_in_ms_to_three_figures(kvlab):
    """Trial 55, finding 9: beside a strategy slower than 1 s/token the column was in s/tok, and a fast one read
    "0.24" or "0.01"; it is ms/tok always, read as the run's table reads it."""
    args = ("race", "static+max", "continuous+paged", "-n", "500")
    r = kvlab(*args)
    assert r.exit_code == 0, r.stderr
    assert "ms/tok" in r.stdout and " s/tok" not in r.stdout
    data = kvlab(*args, "--json").json()
    slow = max(data["strategies"], key=lambda s: s["normalized_latency_s_per_token"]["p50"])
    fast = min(data["strategies"], key=lambda s: s["normalized_latency_s_per_token"]["p50"])
    assert slow["normalized_latency_s_per_token"]["p50"] >= 1.0  # (the case that turned the column to seconds)
    for s in (slow, fast):
        ms = s["normalized_latency_s_per_token"]["p50"] * 1e3
        shown = f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"
        assert shown in _race_row(r.stdout, s["name"]), r.stdout


def test_no_plots_without_out_is_noted_and_plots_without_out_still_refused(kvlab):
    """Trial 55, finding 12: `--no-plots` without `--out` passed silently. It asks for what happens anyway, so it runs,
    with a one-line note; --plots without --out stays refused (it asks for what cannot happen)."""
    for command in ("run", "race"):
        r = kvlab(command, "vllm", "--no-plots", "-n", "20")
        assert r.exit_code == 0, r.stderr
        assert _flat(r.stderr) == "note: --no-plots does nothing without --out (plots are drawn only into that folder)"
    r = kvlab("run", "vllm", "--no-plots", "-n", "20", "--json")
    assert r.exit_code == 0 and "--no-plots does nothing" in r.stderr and r.json()["strategies"]
    assert "--no-plots" not in kvlab("run", "vllm", "-n", "20").stderr
    r = kvlab("run", "vllm", "--plots", "-n", "20")
    assert r.exit_code == 2 and "--plots needs --out" in r.stderr
    assert "without --out nothing is drawn either way" in _flat(kvlab("run", "--help").stdout)


def test_num_requests_and_duration_together_say_that_the_first_limit_wins(kvlab):
    """Trial 55, finding 12: `--duration 10 -n 50` ran 31 requests without saying which option decided. Both
    limit the run, whichever comes first: a note says so, and the help."""
    note = "-n 50 and --duration 10 both given: the run serves the requests arriving in the first 10 s, at most 50 of " \
        "them (whichever limit comes first)"
    r = kvlab("run", "vllm", "--duration", "10", "-n", "50", "--json")
    assert r.exit_code == 0, r.stderr
    assert note in _flat(r.stderr)
    by_time = r.json()["workload"]["num_requests"]
    assert 1 < by_time < 50  # (here the 10 s ran out first)
    assert by_time == kvlab("run", "vllm", "--duration", "10", "--json").json()["workload"]["num_requests"]
    r = kvlab("run", "vllm", "--duration", "100", "-n", "50", "--json")  # (here the 50 requests)
    assert r.json()["workload"]["num_requests"] == 50 and "-n 50 and --duration 100 both given" in _flat(r.stderr)
    for alone in (("-n", "50"), ("--duration", "10")):
        assert "both given" not in kvlab("run", "vllm", *alone).stderr
    assert "with --duration: at most N of those arriving in its time, whichever limit comes first" in _flat(
        kvlab("run", "--help").stdout.replace("│", " "))


def test_fits_replica_count_runs_the_workload_at_once_under_max_num_seqs(kvlab):
    """Trial 55, finding 2: `fit`'s "memory alone" replicas held the requests in their KV caches but each engine runs
    at most max_num_seqs at once: 30,000 short requests on L4 took 8 replicas by the cache (4,230 each), 118 by
    max_num_seqs (256 each)."""
    import math

    args = ("fit", "llama-3.2-1b", "--gpu", "l4", "--context-len", "128", "--concurrency", "30000")
    data = kvlab(*args, "--json").json()
    fewest, cap = data["workload_gpus"]["fewest"], data["max_num_seqs"]["max_num_seqs"]
    assert fewest["max_num_requests"] > cap == fewest["max_num_seqs"] == fewest["num_running_per_replica"]
    assert fewest["num_replicas"] == math.ceil(30000 / cap) > math.ceil(30000 / fewest["max_num_requests"])
    assert fewest["num_gpus"] == fewest["num_replicas"] * fewest["num_gpus_per_replica"]
    text = _flat(kvlab(*args).stdout)
    assert (f"running all 30,000 at once needs more than 1 GPU: the fewest whose KV caches hold them and whose "
            f"max_num_seqs runs them all: {fewest['num_gpus']:,} x L4, {fewest['num_replicas']:,} replicas x TP 1 "
            f"(each KV cache holds {fewest['max_num_requests']:,} of them; each runs at most {cap:,} at once, "
            "max_num_seqs: vLLM's default here)") in text
    # a given --max-num-seqs is the cap, named as given
    data = kvlab(*args, "--max-num-seqs", "1000", "--json").json()
    assert data["workload_gpus"]["fewest"]["num_replicas"] == 30
    assert "each runs at most 1,000 at once, --max-num-seqs 1,000" in _flat(kvlab(*args, "--max-num-seqs", "1000").stdout)
    # where the cache holds fewer than max_num_seqs, memory alone decides, as before
    long = ("fit", "llama-3.2-1b", "--gpu", "l4", "--context-len", "8192", "--concurrency", "3000")
    fewest = kvlab(*long, "--json").json()["workload_gpus"]["fewest"]
    assert fewest["max_num_requests"] < fewest["max_num_seqs"]
    assert fewest["num_replicas"] == math.ceil(3000 / fewest["max_num_requests"])
    assert "memory alone needs more than 1 GPU: the fewest whose KV caches hold the 3,000 requests at once" in \
        _flat(kvlab(*long).stdout)


def test_the_labs_calculator_says_how_many_run_at_once(kvlab):
    """Trial 55, finding 2, the lab: num_fit is the cache's count (kvlab size's), and the answer carries vLLM's
    max_num_seqs (size's) and how many of the workload run at once, which the page words."""
    from kvlab.web.calculator import answer

    size = kvlab("size", "llama-3.2-1b", "--gpu", "h200", "--concurrency", "5000", "--context-len", "128",
                 "--json").json()
    page = answer(model="llama-3.2-1b", gpu="H200", concurrency=5000, context_len=128, gpu_memory_utilization=0.9)
    w = page["workload"]
    assert w["num_fit"] == size["workload"]["max_num_requests"] > 5000 and w["fits"]
    assert w["max_num_seqs"] == size["workload"]["max_num_seqs"] < 5000
    assert w["num_at_once"] == w["max_num_seqs"]
    small = answer(model="llama-3.2-1b", gpu="H200", concurrency=8, context_len=128, gpu_memory_utilization=0.9)
    assert small["workload"]["num_at_once"] == 8


def test_clicks_usage_errors_begin_in_lower_case_as_kvlabs_own(kvlab):
    """Trial 55, finding 16: "error: No such option" and "error: Missing argument" (Click's) beside kvlab's lower-case
    lines; the one place that prints Click's usage errors (kvlab.cli.main) begins them in lower case."""
    cases = {("run", "--nope"): "error: no such option: --nope",
             ("size",): "error: missing argument 'model'",
             ("run", "--rate"): "error: option '--rate' requires an argument",
             ("nope",): "error: no such command 'nope'",
             ("run", "vllm", "extra"): "error: got unexpected extra argument",
             ("run", "--html", "x"): "error: no such option: --html: it is an option of kvlab race",
             ("capacity", "--wide"): "error: no such option: --wide: it is an option of"}
    for args, start in cases.items():
        r = kvlab(*args)
        assert r.exit_code == 2 and _flat(r.stderr).startswith(start), (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # a message that begins with a name in capitals keeps it
    from kvlab.cli import _lowered

    assert _lowered("GPU memory is short") == "GPU memory is short" and _lowered("No such") == "no such"
