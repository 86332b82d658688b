"""A fitted profile's leave-one-out errors as intervals (kvlab/cost/band.py) and where kvlab run shows them."""

from __future__ import annotations

import json
import math

import pytest

from kvlab.cost.band import ErrorBand, error_band
from kvlab.cost.profiles import get_profile, profile_from_dict


def _profile(errors: dict[str, dict[str, float]]):
    return profile_from_dict({
        "name": "fitted", "kind": "efficiency", "source": "a test", "gpu": "H100-SXM",
        "constants": {**get_profile("roofline").constants},
        "fit": {"runs": list(errors), "loo_error": errors}}, "test")


# Eleven runs whose |E2E error| is 0%, 1%, ..., 10%: the p90 is 9% exactly (numpy's linear quantile).
ERRORS = {f"run_{k}": {"e2e_mean": (-1) ** k * k / 100, "ttft_mean": 0.2, "itl_mean": -0.05, "ttft_p99": 1.5}
          for k in range(11)}


def test_the_band_is_the_quantile_of_the_absolute_leave_one_out_errors():
    band = error_band(_profile(ERRORS))
    assert band.num_runs == 11 and band.gpu == "H100-SXM" and band.coverage == 0.9
    assert band.relative["e2e_mean"] == pytest.approx(0.09)
    assert band.relative["ttft_mean"] == pytest.approx(0.2)
    assert band.covers == "LOO p90 over 11 H100-SXM runs"
    assert error_band(_profile(ERRORS), coverage=0.5).relative["e2e_mean"] == pytest.approx(0.05)


def test_a_predicted_value_brackets_the_measured_one_within_the_band():
    band = error_band(_profile(ERRORS))
    lo, hi = band.around(0.1, "ttft_mean")  # predicted / measured - 1 within ±20%
    assert (lo, hi) == (pytest.approx(0.1 / 1.2), pytest.approx(0.1 / 0.8))
    assert band.rate(10.0) == (pytest.approx(9.1), pytest.approx(10.9))  # by the E2E band, 9%
    assert band.around(1.0, "ttft_p99") == (pytest.approx(0.4), math.inf)  # errors past 100%: no upper bound


def test_intervals_cover_each_latency_and_the_throughput_and_are_json():
    band = error_band(_profile(ERRORS))
    summary = {"name": "vllm", "throughput_rps": 2.0, "num_finished": 5, "ttft_s": {"p50": 0.05, "p99": 0.1},
               "tpot_s": {"mean": 0.01}, "e2e_latency_s": {"mean": 1.0},
               "normalized_latency_s_per_token": {"p50": 0.012}}
    intervals = band.intervals(summary)
    assert intervals["throughput_rps"] == [pytest.approx(1.82), pytest.approx(2.18)]
    assert intervals["ttft_s"]["p99"] == [pytest.approx(0.04), None]
    assert intervals["tpot_s"]["mean"] == [pytest.approx(0.01 / 1.05), pytest.approx(0.01 / 0.95)]
    json.loads(json.dumps(intervals, allow_nan=False))


def test_profiles_not_fitted_on_runs_have_no_band():
    assert error_band("roofline") is None
    assert error_band("vidur-a100") is None
    band = error_band("vllm-h100")
    assert isinstance(band, ErrorBand) and band.num_runs == 13
    assert set(band.relative) >= {"e2e_mean", "ttft_mean", "itl_mean"}


def test_kvlab_run_reports_the_band_beside_its_figures(kvlab):
    args = ("run", "--model", "llama-2-7b", "--gpu", "h100-sxm", "-n", "30")
    result = kvlab(*args, "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert data["cost"]["error_band"]["covers"] == "LOO p90 over 13 H100-SXM runs"
    strategy = data["strategies"][0]
    lo, hi = strategy["error_band"]["ttft_s"]["p50"]
    assert lo < strategy["ttft_s"]["p50"] < hi
    text = kvlab(*args)
    assert text.exit_code == 0 and "where the real engine would be (LOO p90 over 13" in " ".join(text.stdout.split())
    roofline = kvlab(*args, "--cost", "roofline", "--json").json()
    assert roofline["cost"]["error_band"] is None and "error_band" not in roofline["strategies"][0]


def test_a_fitted_profile_from_a_file_shows_its_band_and_error_as_a_built_in_does(kvlab, tmp_path):
    """The profile `kvlab calibrate --runs` writes, given as --cost FILE: run, race and capacity name it and quote
    its measured error (each report knows the profile by its name, which this process read from the file)."""
    from importlib import resources

    text = resources.files("kvlab.cost").joinpath("data/vllm-h100.toml").read_text()
    file = tmp_path / "mine.toml"
    file.write_text(text.replace('name = "vllm-h100"', 'name = "mine"'))
    args = ("--model", "llama-2-7b", "--gpu", "h100-sxm", "-n", "30", "--cost", file)
    for command in (("run",), ("race",)):
        r = kvlab(*command, *args)
        words = " ".join(r.stdout.split())
        assert r.exit_code == 0, r.stderr
        assert "where the real engine would be (LOO p90 over 13 H100-SXM runs, profile mine)" in words
        assert "under cost profile 'mine'" in words and "each left out in turn (median)" in words
    r = kvlab("capacity", *args[:4], "-n", "100", "--cost", file, "--slo", "p99_ttft<2s", "--out", tmp_path / "c")
    assert r.exit_code == 0, r.stderr
    words = " ".join(r.stdout.split())
    assert "Answer under mine, the clock asked for (mine (fitted on H100-SXM" in words
    assert "the other clocks are the spread" not in words  # (there is no other)


def test_the_lead_clock_is_named_for_why_it_leads():
    from kvlab.report.setup import lead_text

    assert lead_text("vllm-h100", "H100-SXM", 3).startswith("Answer under vllm-h100, the clock fitted on real runs on "
                                                            "this GPU (")
    # opt-13b on an A100-40GB: paper-2023 is fitted there, but on the paper's figures, not on real runs
    assert lead_text("roofline", "A100-40GB", 2).startswith("Answer under roofline, the stated default: no clock here "
                                                            "is fitted on real runs on this GPU (")
    assert lead_text("vllm-h100", "A100-80GB", 1).startswith("Answer under vllm-h100, the clock asked for (")
