"""kvlab.sweep.slo's ``abandoned<X%`` term: the share of the window's requests whose client gave up at its deadline
(--timeout), judged by itself (an aborted request's latencies are not in the window's), 0 when the target does
not bound it; one clear line for a share that cannot mean anything."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.sweep.slo import parse_slo

STABLE = {"state": "stable", "served_share": 1.0, "num_rejected": 0, "num_arrived": 100, "num_aborted": 0}


def _latencies(n: int, ttft: float = 0.5) -> np.ndarray:
    return np.array([[ttft] * n, [0.02] * n, [3.0] * n, [0.03] * n], dtype=np.float64)


def test_the_share_is_bounded_by_its_term_and_named_when_missed():
    slo = parse_slo("p99_ttft<2s,abandoned<5%")
    assert [t.text for t in slo.terms] == ["p99_ttft<2s"] and slo.max_abandoned == 0.05
    assert slo.text == "p99_ttft<2s,abandoned<5%"
    held = slo.judge({**STABLE, "num_aborted": 5}, _latencies(95))
    assert held.held and held.values == {"p99_ttft<2s": 0.5, "abandoned<5%": 0.05}
    missed = slo.judge({**STABLE, "num_arrived": 150, "num_aborted": 11}, _latencies(139))
    assert not missed.held and missed.reason == "missed abandoned<5% (7.3%)"
    both = slo.judge({**STABLE, "num_aborted": 10}, _latencies(90, ttft=3.0))
    assert both.reason == "missed p99_ttft<2s (3 s); missed abandoned<5% (10.0%)"


def test_without_the_term_no_client_may_give_up():
    slo = parse_slo("p99_ttft<2s")
    assert slo.judge(STABLE, _latencies(100)).held
    verdict = slo.judge({**STABLE, "num_aborted": 1}, _latencies(99))
    assert verdict.reason == "missed abandoned=0% (1.0%: without a term such as abandoned<5% no client may give up)"
    assert verdict.values == {"p99_ttft<2s": 0.5, "abandoned=0%": 0.01}
    assert slo.judge(STABLE, _latencies(100)).values == {"p99_ttft<2s": 0.5}  # (no share to show when none gave up)


def test_a_window_that_did_not_keep_up_fails_on_its_state_first():
    verdict = parse_slo("p99_ttft<2s,abandoned<50%").judge(
        {**STABLE, "state": "overloaded", "decided_by": "oldest wait grew", "num_aborted": 10}, _latencies(90))
    assert verdict.reason == "overloaded: oldest wait grew"


def test_goodput_counts_an_aborted_request_as_not_good():
    # 90 served, all within 1 s; 10 aborted: 90% of the offered requests were good.
    window = {**STABLE, "num_aborted": 10}
    assert parse_slo("ttft<1s,abandoned<20%", goodput=0.9).judge(window, _latencies(90)).attainment == 0.9
    verdict = parse_slo("ttft<1s,abandoned<20%", goodput=0.95).judge(window, _latencies(90))
    assert not verdict.held and verdict.reason == "missed 90.0% of requests met every term"
    assert verdict.values == {"ttft<1s": 1.0, "abandoned<20%": 0.1}


def test_the_share_alone_asks_at_which_rate_few_enough_clients_give_up():
    slo = parse_slo("abandoned<2.5%")
    assert slo.terms == () and slo.max_abandoned == 0.025
    verdict = slo.judge({**STABLE, "num_aborted": 2}, _latencies(98))
    assert verdict.held and slo.value(verdict) == 0.02


@pytest.mark.parametrize(("text", "goodput", "message"), [
    ("p99_ttft<2s,abandoned<150%", None, "--slo 'p99_ttft<2s,abandoned<150%': the term 'abandoned<150%': 150% is "
     "not a share a client may give up at; valid: a percentage above 0% and below 100%, e.g. abandoned<5% (without "
     "the term no client may give up)"),
    ("abandoned<0%", None, "--slo 'abandoned<0%': 0% is not a share a client may give up at; valid: a percentage "
     "above 0% and below 100%, e.g. abandoned<5% (without the term no client may give up)"),
    ("abandoned<5", None, "--slo 'abandoned<5': the share 5 has no unit; valid: a percentage above 0% and below "
     "100%, e.g. abandoned<5%"),
    ("abandoned<5s", None, "--slo 'abandoned<5s': the share 5s is not a percentage; valid: a percentage above 0% "
     "and below 100%, e.g. abandoned<5%"),
    ("p99_ttft<2s,p99_abandoned<5%", None, "--slo 'p99_ttft<2s,p99_abandoned<5%': the term 'p99_abandoned<5%': "
     "abandoned is the share of the window's requests whose client gave up, not a latency: no statistic ('p99'); "
     "valid: a percentage above 0% and below 100%, e.g. abandoned<5%"),
    ("abandoned<5%,abandoned<3%", None, "--slo 'abandoned<5%,abandoned<3%': 'abandoned<5%' and 'abandoned<3%' both "
     "bound the abandoned share; give it once"),
    ("p99_ttft<5%", None, "--slo 'p99_ttft<5%': a latency is bounded in s, ms or us, not %; a share bounds only "
     "abandoned (e.g. abandoned<5%)"),
    ("abandoned<5%", 0.9, "--slo 'abandoned<5%' with --goodput 0.9: goodput needs a latency term to judge each "
     "request against"),
])
def test_a_share_that_cannot_mean_anything_is_one_line(text, goodput, message):
    with pytest.raises(KvlabError) as error:
        parse_slo(text, goodput)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_class_reports_its_abandoned_share_and_its_target_bounds_it():
    from kvlab.metrics import RequestRecord
    from kvlab.service.classes import class_summaries

    def record(i, status):
        done = status == "finished"
        return RequestRecord(i, float(i), 100, 10, status, float(i) if done else None, i + 0.1 if done else None,
                             i + 1.0, 0)

    records = [record(i, "aborted" if i in (3, 7) else "finished") for i in range(10)]
    classes = class_summaries(records, {i: i % 2 for i in range(10)},
                              {0: parse_slo("p99_ttft<1s"), 1: parse_slo("p99_ttft<1s,abandoned<50%")})
    # class 0: 0 2 4 6 8, none aborted; class 1: 1 3 5 7 9, two of five aborted.
    assert (classes["0"]["abandoned_share"], classes["0"]["slo_held"]) == (0.0, True)
    assert (classes["1"]["num_aborted"], classes["1"]["abandoned_share"], classes["1"]["slo_held"]) == (2, 0.4, True)
    assert classes["1"]["slo_values"]["abandoned<50%"] == 0.4 and classes["1"]["goodput"] == 0.6
    strict = class_summaries(records, {i: i % 2 for i in range(10)}, {1: parse_slo("p99_ttft<1s")})
    assert strict["1"]["slo_held"] is False  # (without the term no client may give up)


def test_an_abandoned_bound_without_any_deadline_is_refused_in_one_line(tmp_path):
    from kvlab.errors import KvlabError
    from kvlab.service.classes import check_deadlines
    from kvlab.sweep.slo import parse_slo

    target = parse_slo("p99_ttft<2s,abandoned<5%")
    with pytest.raises(KvlabError, match=r"^abandoned<5%: no request in this workload has a deadline; valid: with "
                                         r"--timeout SECONDS or a workload file's timeout column$"):
        check_deadlines([target], [{"workload": "paper-sharegpt", "timeout": "30"}, {"workload": "paper-sharegpt"}])
    check_deadlines([target], [{"workload": "paper-sharegpt", "timeout": "30"}])
    check_deadlines([parse_slo("p99_ttft<2s")], [{"workload": "paper-sharegpt"}])  # (no bound: nothing to check)
    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,timeout\n100,50,0.5,30\n80,20,0.1,2.5\n")
    check_deadlines([target], [{"workload": str(path)}])
    plain = tmp_path / "plain.csv"
    plain.write_text("prompt_len,output_len,arrival_time\n100,50,0.5\n")
    with pytest.raises(KvlabError, match="no request in this workload has a deadline"):
        check_deadlines([target], [{"workload": str(plain)}])


def test_run_refuses_a_class_abandoned_bound_without_deadlines(kvlab):
    r = kvlab("run", "vllm", "-n", "10", "--slo-classes", "0:abandoned<5%")
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "error: abandoned<5%: no request in this workload has a deadline; valid: with --timeout SECONDS or a "
        "workload file's timeout column"]
    assert kvlab("run", "vllm", "-n", "10", "--slo-classes", "0:abandoned<5%", "--timeout", "30").exit_code == 0


@pytest.mark.parametrize("extra", [[], ["--replicas", "auto", "--rate", "2"],
                                   ["--replicas", "auto", "--prefill-replicas", "auto", "--rate", "2"]])
def test_capacity_refuses_an_abandoned_bound_without_deadlines_before_any_run(kvlab, tmp_path, extra):
    r = kvlab("capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-n", "100", *extra,
              "--slo", "p99_ttft<2s,abandoned<5%", "--out", str(tmp_path))
    assert r.exit_code == 2 and "points:" not in r.stderr
    assert r.stderr.strip() == ("error: abandoned<5%: no request in this workload has a deadline; valid: with "
                                "--timeout SECONDS or a workload file's timeout column")
