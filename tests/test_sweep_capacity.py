"""kvlab capacity: the rate it reports meets the target over its measured window when simulated on its own, the
next rate of the bracket does not; the bracket and the simulations are reported; a second search reuses the stored
simulations. (tests/test_capacity_sustained.py: sustained rates, setups, the clock's spread.)"""

from __future__ import annotations

import pytest

CAPACITY = ["--strategy", "vllm,orca-max", "-n", "400", "--cost", "roofline", "--workers", "2"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    import json
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("capacity")
    r = subprocess.run([sys.executable, "-m", "kvlab", "capacity", *CAPACITY, "--out", str(out), "--json"],
                       check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def _judged(strategy: str, rate: float, slo: str):
    """The point simulated on its own (the worker's function) and judged against ``slo``."""
    from kvlab.sweep.capacity import parse_slo, verdict
    from kvlab.sweep.grid import expand
    from kvlab.sweep.point import simulate_point

    (point,) = expand({"strategy": [strategy], "rate": [str(rate)], "num_requests": ["400"]})
    summary, latencies = simulate_point(point)
    import json

    return verdict(parse_slo(slo), {"summary": json.dumps(summary), "window_latencies": latencies})[0]


def test_the_capacity_holds_and_the_bracket_s_other_end_fails(searched, kvlab):
    _, data = searched
    assert data["slo"] == "mean_normalized_latency<0.1s"
    by_strategy = {c["strategy"]: c for c in data["capacities"]}
    assert set(by_strategy) == {"vllm", "orca-max"}
    for strategy, c in by_strategy.items():
        lo, hi = c["bracket"]
        assert c["capacity_rps"] == lo and hi / lo - 1 <= 0.05
        assert c["num_simulations"] == len(c["probes"]) >= 3
        # The same simulations, run on their own
        held = _judged(strategy, lo, data["slo"])
        assert held.held and held.values[data["slo"]] < 0.1
        assert not _judged(strategy, hi, data["slo"]).held
    assert by_strategy["vllm"]["capacity_rps"] > 2 * by_strategy["orca-max"]["capacity_rps"]
    # (each configuration searched on two samples: the workload and twice it)
    assert data["num_computed"] == sum(sum(c["samples"]["num_simulations"]) for c in data["capacities"])
    for c in data["capacities"]:
        assert c["samples"]["lengths"] == [400, 800] and c["samples"]["num_simulations"][0] == c["num_simulations"]
        assert c["samples"]["answer_rps"] == min(c["samples"]["capacities"])


def test_another_target_gives_another_capacity_and_reuses_the_store(searched, kvlab):
    out, data = searched
    r = kvlab("capacity", *CAPACITY, "--slo", "p99_ttft<2s", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    ttft = {c["strategy"]: c for c in r.json()["capacities"]}
    lo, hi = ttft["vllm"]["bracket"]
    assert _judged("vllm", lo, "p99_ttft<2s").held and not _judged("vllm", hi, "p99_ttft<2s").held
    assert r.json()["num_computed"] < sum(sum(c["samples"]["num_simulations"]) for c in ttft.values())  # (stored)
    r = kvlab("capacity", *CAPACITY, "--out", out, "--json")
    assert r.json()["num_computed"] == 0
    assert [c["capacity_rps"] for c in r.json()["capacities"]] == [c["capacity_rps"] for c in data["capacities"]]


def test_capacity_table_and_plots(searched, kvlab):
    out, _ = searched
    r = kvlab("capacity", *CAPACITY, "--out", out)
    assert r.exit_code == 0, r.stderr
    assert "req/s" in r.stdout and "bracket" in r.stdout and "stable" in r.stdout and "vllm" in r.stdout and "orca-max" in r.stdout
    assert "Computed 0 simulations now, " in r.stdout and " were stored already." in " ".join(r.stdout.split())
    for name in ("capacity.png", "capacity_latency.png", "capacity.html"):
        assert (out / name).stat().st_size > 1000
    page = (out / "capacity.html").read_text()  # one profile: a bar per strategy, named under it
    assert page.count('<rect class="bar"') == 2 and ">vllm</text>" in page and ">orca-max</text>" in page


def test_a_workload_too_short_to_fail_says_the_capacity_is_not_certified(kvlab, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = kvlab("capacity", "-n", "30", "--cost", "roofline", "--max-rate", "8", "--workers", "1", "--out",
              tmp_path / "c")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "none (8 ?)" in text and "not certified: no rate tried failed, and the run at 8 req/s was too short to load the engine" in text
    assert "raise -n or --duration" in text
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout


@pytest.mark.parametrize("args, message", [
    (["--rate", "1,2"], "give --rate one value"),
    (["--workers", "0"], "--workers 0 is out of range; valid: worker processes (or Ray CPUs), a whole number from 1 to 1,024"),
    (["--max-rate", "0"], "--max-rate 0 is out of range"),
    (["--max-rate", "inf"], "--max-rate inf is not a finite number"),
    (["--max-rate", "0.5"], "--max-rate 0.5 is below the first rate tried (--rate 1)"),
    (["--slo", "p99_ttft>2s"], "--slo"),
    (["--slo", "P99_TTFT<2S"], "with a unit (s, ms or us) (names and units are lower case)"),  # (trial 50)
    (["--rtol", "0"], "--rtol 0 is out of range; valid: a relative width in (0, 1)"),
])
def test_capacity_bad_input(kvlab, tmp_path, args, message):
    r = kvlab("capacity", "-n", "50", *args, "--out", tmp_path / "c")
    assert r.exit_code == 2 and message in r.stderr
    assert not (tmp_path / "c").exists()
