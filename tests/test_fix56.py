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
    assert "judged on its measured window (the latencies shown are its)" in helped
    assert "Measured window: the requests arriving after a 20% warm-up, up to the last arrival" in helped


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
