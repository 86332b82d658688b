"""kvlab.sweep.slo: several terms at once, goodput (DistServe's: the share of requests meeting every term), and
one clear line for a target that cannot mean anything."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.sweep.slo import parse_slo

STABLE = {"state": "stable", "served_share": 1.0, "queue_first_half": 0.0, "queue_second_half": 0.0,
          "num_rejected": 0}


def _latencies(ttft, tpot, e2e=None, norm=None):
    n = len(ttft)
    return np.array([ttft, tpot, e2e or [1.0] * n, norm or [0.01] * n], dtype=np.float64)


def test_every_term_must_hold():
    slo = parse_slo("p99_ttft<2s,p50_tpot<100ms")
    assert [(t.metric, t.stat, t.limit_s) for t in slo.terms] == [("ttft_s", "p99", 2.0), ("tpot_s", "p50", 0.1)]
    good = _latencies([0.5] * 100, [0.05] * 100)
    assert slo.judge(STABLE, good).held
    slow_tokens = _latencies([0.5] * 100, [0.2] * 100)
    verdict = slo.judge(STABLE, slow_tokens)
    assert not verdict.held and verdict.reason == "missed p50_tpot<100ms (200 ms)"
    assert verdict.values["p50_tpot<100ms"] == pytest.approx(0.2)


def test_a_percentile_is_numpys_linear_interpolation_over_the_windows_requests():
    values = list(np.linspace(0.0, 3.0, 101))
    slo = parse_slo("p90_ttft<2.8s")
    assert slo.terms[0].value(_latencies(values, [0.0] * 101)) == pytest.approx(2.7)


def test_goodput_is_the_share_meeting_every_term_at_once():
    # 10 requests: 8 meet both, one misses TTFT, one misses TPOT: 80% attain.
    ttft = [0.1] * 8 + [5.0, 0.1]
    tpot = [0.01] * 8 + [0.01, 0.5]
    lat = _latencies(ttft, tpot)
    assert parse_slo("ttft<1s,tpot<100ms", goodput=0.8).judge(STABLE, lat).held
    verdict = parse_slo("ttft<1s,tpot<100ms", goodput=0.9).judge(STABLE, lat)
    assert not verdict.held and verdict.attainment == pytest.approx(0.8)
    assert verdict.values == {"ttft<1s": pytest.approx(0.9), "tpot<100ms": pytest.approx(0.9)}


def test_a_one_token_answer_meets_any_tpot_term_and_a_refused_request_meets_none():
    lat = _latencies([0.1, math.inf], [math.nan, math.nan])
    verdict = parse_slo("ttft<1s,tpot<100ms", goodput=0.5).judge(STABLE, lat)
    assert verdict.attainment == pytest.approx(0.5)


def test_a_run_that_did_not_keep_up_fails_whatever_its_latencies():
    decided = "oldest wait grew: served 60.0% of offered (queue 10 → 20 waiting, oldest wait 5 s → 9 s)"
    verdict = parse_slo("p99_ttft<2s").judge({**STABLE, "state": "overloaded", "served_share": 0.6,
                                              "decided_by": decided}, _latencies([0.1] * 10, [0.01] * 10))
    assert not verdict.held and verdict.reason == f"overloaded: {decided}"  # (the signal that decided it named)
    refused = parse_slo("p99_ttft<2s").judge({**STABLE, "num_rejected": 3}, _latencies([0.1] * 10, [0.01] * 10))
    assert not refused.held and refused.reason == "3 requests refused"


@pytest.mark.parametrize("text, goodput, message", [
    ("p99_latency<2s", None, "'latency' is not a latency kvlab reports; use e2e, e2e_latency, normalized"),
    ("q99_ttft<2s", None, "'q99' is not a statistic: use mean or pNN such as p99"),
    ("p100_ttft<2s", None, "'p100' is not a percentile; use p1 to p99.9 (or mean)"),
    ("p99_ttft<2h", None, "'h' is not a unit; use s, ms or us"),
    ("p99_ttft<2", None, "the limit 2 has no unit; use s, ms or us (e.g. 2s"),
    ("p99_ttft>2s", None, "expected STAT_METRIC<VALUE with a unit"),
    ("", None, "an empty term"),
    ("p99_ttft<2s,", None, "an empty term"),
    ("p99_ttft<2s,p99_ttft<1s", None, "'p99_ttft<2s' and 'p99_ttft<1s' bound the same statistic twice"),
    ("p99_ttft<0s", None, "the limit 0s is out of range; valid: a positive latency of at most 86,400 s (a day)"),
    ("p99_ttft<1e999s", None, "the limit 1e999s is out of range; valid: a positive latency of at most 86,400 s"),
    ("p99_ttft<1.7e308s", None, "the limit 1.7e308s is out of range"),
    ("p99_ttft<86400001ms", None, "the limit 86400001ms is out of range"),
    ("ttft<2s", None, "which statistic? e.g. p99_ttft<2s, or judge each request against it with --goodput"),
    ("p99_ttft<2s", 0.9, "with --goodput each request is judged against the term: write it without a statistic"),
    ("ttft<2s", 1.5, "--goodput 1.5: the share of requests that must meet every term is in (0, 1]"),
    ("ttft<2s", 0.0, "--goodput 0: the share"),
])
def test_bad_targets_are_one_line_naming_the_value_and_what_is_valid(text, goodput, message):
    with pytest.raises(KvlabError) as info:
        parse_slo(text, goodput)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_percentile_over_refused_requests_is_infinite_without_numpys_warning():
    """A refused request's latency is infinite (kvlab.window.latencies): a percentile that takes weight from it is
    infinite, one that takes none is its finite neighbour, and NumPy's inf - inf never runs (trial 59: capacity
    printed 'RuntimeWarning: invalid value encountered in scalar subtract' where a strategy served nothing)."""
    inf = math.inf
    p99, p50 = parse_slo("p99_ttft<2s").terms[0], parse_slo("p50_ttft<2s").terms[0]
    assert p99.value(_latencies([inf] * 10, [0.0] * 10)) == inf
    assert p99.value(_latencies([0.1, 0.2, 0.3, inf], [0.0] * 4)) == inf
    assert p50.value(_latencies([0.1, 0.2, 0.3, inf], [0.0] * 4)) == pytest.approx(0.25)
    assert p50.value(_latencies([0.1, 0.2, inf, inf, inf], [0.0] * 5)) == inf
    assert p50.value(_latencies([0.4, 0.5, inf], [0.0] * 3)) == 0.5  # no weight on the infinite neighbour
    verdict = parse_slo("p99_ttft<2s").judge(STABLE, _latencies([inf] * 10, [0.0] * 10))
    assert not verdict.held and verdict.values["p99_ttft<2s"] == inf
    assert verdict.reason == "missed p99_ttft<2s (unbounded: refused requests)"
