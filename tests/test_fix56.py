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
