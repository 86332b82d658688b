"""Workloads: bundled traces, stand-ins, arrival processes, user files and their errors."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from datetime import datetime

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.workload import WORKLOADS, Request, Workload, list_workloads, load_workload
from kvlab.workload.arrivals import spread_within_bins
from kvlab.workload.published import require


def _needs_rate(name: str) -> dict:
    return {} if WORKLOADS[name].kind == "trace" else {"rate": 2.0}


def _gaps(workload: Workload) -> np.ndarray:
    return np.diff([0.0] + [r.arrival_time for r in workload.requests])


# --- every bundled workload ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_bundled_workload_loads_with_sane_values(name):
    workload = load_workload(name, num_requests=100, **_needs_rate(name))
    assert workload.name == name
    assert workload.num_requests == 100
    assert [r.request_id for r in workload.requests] == list(range(100))
    times = [r.arrival_time for r in workload.requests]
    assert times == sorted(times) and times[0] >= 0
    assert all(isinstance(r.prompt_len, int) and r.prompt_len >= 1 for r in workload.requests)
    assert all(isinstance(r.output_len, int) and r.output_len >= 1 for r in workload.requests)
    assert all(isinstance(r.arrival_time, float) for r in workload.requests)
    assert workload.source and name in workload.description


def test_list_workloads_counts_every_row_of_every_file():
    info = {row.name: row for row in list_workloads()}
    assert list(info) == list(WORKLOADS)
    expected_rows = {
        "azure-conv": 19_366, "azure-code": 8_819, "mooncake-conversation": 12_031, "mooncake-synthetic": 3_993,
        "burstgpt": 383, "llmservingsim-sharegpt": 300, "sharegpt-8k": 30_731, "arxiv": 28_257, "bwb": 33_768,
        "paper-sharegpt": 30_731, "paper-alpaca": None, "sessions": None,
    }
    assert {name: row.num_rows for name, row in info.items()} == expected_rows
    assert info["burstgpt"].num_skipped == 17
    assert info["azure-conv"].kind == "trace with arrivals" and info["arxiv"].kind == "lengths only"
    assert info["paper-alpaca"].kind == "stand-in" and info["paper-sharegpt"].kind == "stand-in"
    assert info["sessions"].kind == "generated sessions"
    # The README's means (input / output): Azure conv 1,155 / 211, BWB 1,067 / 1,613.
    assert round(info["azure-conv"].mean_prompt_len) == 1155 and round(info["azure-conv"].mean_output_len) == 211
    assert round(info["bwb"].mean_prompt_len) == 1067 and round(info["bwb"].mean_output_len) == 1613
    assert info["azure-conv"].mean_rate == pytest.approx(5.5, abs=0.05)
    assert info["arxiv"].mean_rate is None
    assert all(row.licence for row in info.values())


# --- seeds -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["paper-sharegpt", "paper-alpaca", "arxiv"])
@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
def test_same_seed_same_requests_different_seed_different(name, arrival):
    cv = 2.0 if arrival == "gamma" else 1.0
    first = load_workload(name, num_requests=500, rate=3.0, arrival=arrival, cv=cv, seed=7)
    again = load_workload(name, num_requests=500, rate=3.0, arrival=arrival, cv=cv, seed=7)
    other = load_workload(name, num_requests=500, rate=3.0, arrival=arrival, cv=cv, seed=8)
    assert first == again
    assert [r.prompt_len for r in first.requests] != [r.prompt_len for r in other.requests]
    assert [r.arrival_time for r in first.requests] != [r.arrival_time for r in other.requests]


def test_same_seed_same_requests_in_another_process():
    code = (
        "from kvlab.workload import load_workload\n"
        "w = load_workload('paper-sharegpt', num_requests=300, rate=1.5, seed=3)\n"
        "print(repr([(r.arrival_time, r.prompt_len, r.output_len) for r in w.requests]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    here = load_workload("paper-sharegpt", num_requests=300, rate=1.5, seed=3)
    assert out.strip() == repr([(r.arrival_time, r.prompt_len, r.output_len) for r in here.requests])


def test_golden_first_requests():
    # Pinned so that a change to the sampling (which would change every golden simulation) is seen here first.
    sharegpt = load_workload("paper-sharegpt", num_requests=3, rate=1.0, seed=0)
    alpaca = load_workload("paper-alpaca", num_requests=3, rate=1.0, seed=0)
    times = [0.8031044072628015, 1.1851061196953891, 1.5492821239285963]
    assert [r.arrival_time for r in sharegpt.requests] == pytest.approx(times, rel=1e-12)
    assert [(r.prompt_len, r.output_len) for r in sharegpt.requests] == [(459, 389), (26, 561), (60, 362)]
    assert [(r.prompt_len, r.output_len) for r in alpaca.requests] == [(45, 25), (25, 46), (28, 52)]


def test_lengths_do_not_depend_on_the_rate_or_process():
    slow = load_workload("paper-sharegpt", num_requests=200, rate=0.5, seed=1)
    bursty = load_workload("paper-sharegpt", num_requests=200, rate=9.0, arrival="gamma", cv=4.0, seed=1)
    assert [(r.prompt_len, r.output_len) for r in slow.requests] == [(r.prompt_len, r.output_len) for r in bursty.requests]


def test_a_longer_workload_starts_with_the_shorter_one():
    short = load_workload("paper-alpaca", num_requests=100, rate=2.0, seed=5)
    long = load_workload("paper-alpaca", num_requests=10_000, rate=2.0, seed=5)
    assert long.requests[:100] == short.requests


def test_duration_keeps_the_requests_arriving_before_it():
    by_count = load_workload("sharegpt-8k", num_requests=5_000, rate=4.0, seed=2)
    by_time = load_workload("sharegpt-8k", duration=600.0, rate=4.0, seed=2)
    expected = tuple(r for r in by_count.requests if r.arrival_time < 600.0)
    assert by_time.requests == expected
    assert 2_200 < by_time.num_requests < 2_600  # Poisson(2,400): ±8 standard deviations
    both = load_workload("sharegpt-8k", num_requests=50, duration=600.0, rate=4.0, seed=2)
    assert both.requests == expected[:50]


def test_lengths_trace_draws_each_row_once_per_pass():
    everything = load_workload("llmservingsim-sharegpt", arrival="burst")
    assert everything.num_requests == 300
    rows = sorted((r.prompt_len, r.output_len) for r in everything.requests)
    _, prompt, output = _csv("llmservingsim-sharegpt")
    assert rows == sorted(zip(map(int, prompt), map(int, output)))


# --- arrival processes -----------------------------------------------------------------------------------------


def test_poisson_arrivals_have_the_asked_rate_and_unit_cv():
    gaps = _gaps(load_workload("paper-alpaca", num_requests=200_000, rate=4.0, seed=11))
    # Mean of 200,000 exponential gaps: standard error 0.25/√200000 ≈ 0.00056; allow 1%.
    assert gaps.mean() == pytest.approx(0.25, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.01)
    assert gaps.min() > 0


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_arrivals_have_the_asked_rate_and_cv(cv):
    gaps = _gaps(load_workload("paper-alpaca", num_requests=200_000, rate=2.0, arrival="gamma", cv=cv, seed=4))
    assert gaps.mean() == pytest.approx(0.5, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_burst_puts_everyone_at_time_zero():
    workload = load_workload("paper-sharegpt", num_requests=64, arrival="burst")
    assert {r.arrival_time for r in workload.requests} == {0.0}
    assert workload.request_rate == math.inf


def test_poisson_on_a_trace_without_rate_uses_the_trace_rate():
    workload = load_workload("azure-conv", arrival="poisson", num_requests=50_000, seed=1)
    own = next(row for row in list_workloads() if row.name == "azure-conv").mean_rate
    assert _gaps(workload).mean() == pytest.approx(1 / own, rel=0.02)


# --- a trace's own arrivals ------------------------------------------------------------------------------------


def _read_text(name: str) -> str:
    """The text of published trace ``name`` where the tests find it (KVLAB_TRACES_DIR: ../shared/data/traces)."""
    return require(name).read_text(encoding="utf-8")


def _csv(name: str) -> tuple[list[str], ...]:
    rows = list(csv.reader(_read_text(name).splitlines()))[1:]
    return tuple(list(column) for column in zip(*rows))


def test_azure_arrivals_are_the_file_timestamps():
    stamps, prompt, output = _csv("azure-conv")
    clock = [datetime.strptime(s[:26], "%Y-%m-%d %H:%M:%S.%f") for s in stamps[:20]]
    expected = [(t - clock[0]).total_seconds() for t in clock]
    workload = load_workload("azure-conv", num_requests=20)
    assert [r.arrival_time for r in workload.requests] == pytest.approx(expected, abs=1e-6)
    assert [r.prompt_len for r in workload.requests] == [int(p) for p in prompt[:20]]
    assert [r.output_len for r in workload.requests] == [int(o) for o in output[:20]]


def test_trace_rescaled_to_a_rate_keeps_its_pattern():
    own = load_workload("azure-code")
    faster = load_workload("azure-code", rate=26.0)
    assert faster.num_requests == own.num_requests == 8_819
    factor = faster.requests[-1].arrival_time / own.requests[-1].arrival_time
    assert (8_819 - 1) / faster.requests[-1].arrival_time == pytest.approx(26.0)
    assert [r.arrival_time for r in faster.requests] == pytest.approx([r.arrival_time * factor for r in own.requests])
    assert [r.prompt_len for r in faster.requests] == [r.prompt_len for r in own.requests]


def test_trace_limits_take_the_first_requests_or_those_before_the_duration():
    own = load_workload("azure-conv")
    assert load_workload("azure-conv", num_requests=10).requests == own.requests[:10]
    cut = load_workload("azure-conv", duration=60.0)
    assert cut.requests == tuple(r for r in own.requests if r.arrival_time < 60.0)
    assert load_workload("azure-conv", arrival="trace", num_requests=10).requests == own.requests[:10]


def test_burstgpt_skips_failed_rows_and_says_so():
    workload = load_workload("burstgpt")
    assert workload.num_requests == 383
    assert "17 of 400 source rows skipped" in workload.description
    assert all(r.prompt_len > 0 and r.output_len > 0 for r in workload.requests)
    assert workload.requests[0].arrival_time == 0.0 and workload.requests[1].arrival_time == 40.0  # stamps 5, 45


def test_llmservingsim_arrivals_are_seconds():
    workload = load_workload("llmservingsim-sharegpt")
    assert workload.requests[1].arrival_time == pytest.approx((347_938_951 - 46_926_808) / 1e9)
    assert workload.requests[0].prompt_len == 2358 and workload.requests[0].output_len == 531


# --- Mooncake --------------------------------------------------------------------------------------------------


def test_mooncake_hash_ids_become_prefix_hashes():
    rows = [json.loads(line) for line in _read_text("mooncake-conversation").splitlines()[:30]]
    workload = load_workload("mooncake-conversation", num_requests=30)
    for request, row in zip(workload.requests, rows):
        assert request.prefix_hashes == tuple(row["hash_ids"])
        assert request.prefix_chunk_len == 512
        assert request.prompt_len == row["input_length"] and request.output_len == row["output_length"]
        assert len(request.prefix_hashes) == -(-request.prompt_len // 512)
    # The first two requests share block 0: 512 tokens of common prefix.
    assert workload.requests[0].prefix_hashes[0] == workload.requests[1].prefix_hashes[0] == 0


def test_mooncake_bins_are_spread_evenly_within_three_seconds():
    rows = [json.loads(line) for line in _read_text("mooncake-conversation").splitlines()]
    stamps = np.array([row["timestamp"] for row in rows]) / 1e3
    workload = load_workload("mooncake-conversation")
    times = np.array([r.arrival_time for r in workload.requests])
    assert np.all(np.diff(times) > 0)
    # Every request stays in its own bin: [stamp, next stamp).
    bins = np.unique(stamps)
    assert np.array_equal(np.searchsorted(bins, times, side="right") - 1, np.searchsorted(bins, stamps))
    # The first bin (t = 0) holds requests spread at equal steps over the 3 s to the next stamp.
    first = times[stamps == 0]
    assert np.allclose(first, np.arange(len(first)) * bins[1] / len(first))


def test_spread_within_bins_exact():
    times = np.array([0.0, 0.0, 0.0, 3.0, 9.0, 9.0])
    # Bin at 3 s: next stamp 6 s later, so its width is capped at bin_width 3.
    assert spread_within_bins(times, 3.0).tolist() == [0.0, 1.0, 2.0, 3.0, 9.0, 10.5]


def test_mooncake_synthetic_keeps_millisecond_stamps():
    workload = load_workload("mooncake-synthetic", num_requests=3)
    assert [r.arrival_time for r in workload.requests] == [0.0, 0.0, 0.04]


# --- the paper's stand-ins -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, prompt_mean, output_mean", [("paper-sharegpt", 161.31, 337.99), ("paper-alpaca", 19.31, 58.45)]
)
def test_stand_in_means_match_the_paper_and_fit_opt(name, prompt_mean, output_mean):
    workload = load_workload(name, num_requests=200_000, arrival="burst", seed=0)
    prompt = np.array([r.prompt_len for r in workload.requests])
    output = np.array([r.output_len for r in workload.requests])
    assert prompt.mean() == pytest.approx(prompt_mean, rel=0.02)
    assert output.mean() == pytest.approx(output_mean, rel=0.02)
    assert (prompt + output).max() <= 2048
    assert prompt.min() >= 1 and output.min() >= 1
    assert "stand-in" in workload.description


def test_stand_in_models_have_the_paper_means_exactly():
    info = {row.name: row for row in list_workloads()}
    assert info["paper-sharegpt"].mean_prompt_len == pytest.approx(161.31, rel=1e-3)
    assert info["paper-sharegpt"].mean_output_len == pytest.approx(337.99, rel=1e-3)
    assert info["paper-alpaca"].mean_prompt_len == pytest.approx(19.31, rel=1e-6)
    assert info["paper-alpaca"].mean_output_len == pytest.approx(58.45, rel=1e-6)


def test_paper_sharegpt_keeps_the_shape_of_its_source():
    # Rescaling keeps each column's coefficient of variation (up to rounding to whole tokens).
    source = load_workload("sharegpt-8k", arrival="burst")
    stand_in = load_workload("paper-sharegpt", num_requests=30_731, arrival="burst")
    for column in ("prompt_len", "output_len"):
        a = np.array([getattr(r, column) for r in source.requests], dtype=float)
        b = np.array([getattr(r, column) for r in stand_in.requests], dtype=float)
        assert b.std() / b.mean() == pytest.approx(a.std() / a.mean(), rel=0.02)


# --- max_model_len ---------------------------------------------------------------------------------------------


def test_max_model_len_stops_answers_as_vllm_does():
    workload = load_workload("azure-conv", num_requests=2_000, max_model_len=1024)
    plain = load_workload("azure-conv", num_requests=2_000)
    for request, original in zip(workload.requests, plain.requests):
        assert request.output_len == original.output_len  # the true length is kept
        if request.prompt_len >= 1024:
            assert request.max_tokens is None  # the engine rejects it
        else:
            assert request.prompt_len + request.num_output_tokens <= 1024
            assert request.num_output_tokens == min(original.output_len, 1024 - request.prompt_len)
    num_capped = sum(r.max_tokens is not None for r in workload.requests)
    assert num_capped > 0 and f"{num_capped:,} answers capped" in workload.description


# --- the user's files ------------------------------------------------------------------------------------------


def _write_csv(path, workload: Workload) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrival_time", "prompt_len", "output_len", "max_tokens"])
        for r in workload.requests:
            writer.writerow([repr(r.arrival_time), r.prompt_len, r.output_len, "" if r.max_tokens is None else r.max_tokens])


def test_user_csv_round_trip(tmp_path):
    original = load_workload("azure-conv", num_requests=300, max_model_len=1500)
    assert any(r.max_tokens is not None for r in original.requests)
    path = tmp_path / "mine.csv"
    _write_csv(path, original)
    loaded = load_workload(str(path))
    assert loaded.requests == original.requests
    assert loaded.name == "mine.csv"


def test_user_jsonl_round_trip(tmp_path):
    original = load_workload("paper-sharegpt", num_requests=300, rate=3.0, seed=9)
    path = tmp_path / "mine.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"arrival_time": r.arrival_time, "prompt_len": r.prompt_len, "output_len": r.output_len})
            for r in original.requests
        )
        + "\n"
    )
    assert load_workload(str(path)).requests == original.requests
    # The file's own arrivals, rescaled, or replaced by a process, like any trace.
    assert load_workload(str(path), rate=6.0).requests[-1].arrival_time == pytest.approx(299 / 6.0)
    assert load_workload(str(path), arrival="burst").num_requests == 300


def test_user_file_rows_are_sorted_by_arrival(tmp_path):
    path = tmp_path / "unsorted.csv"
    path.write_text("prompt_len,arrival_time,output_len,note\n10,2.5,3,x\n20,0.5,4,y\n30,1.0,5,z\n")
    workload = load_workload(str(path))
    assert workload.requests == (
        Request(0, 0.5, 20, 4),
        Request(1, 1.0, 30, 5),
        Request(2, 2.5, 10, 3),
    )


BAD_FILES = [
    ("a.csv", "arrival_time,prompt_len\n0,10\n", "line 1", "output_len"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0,10,5\n1,ten,5\n", "line 3", "'ten'"),
    ("a.csv", "arrival_time,prompt_len,output_len\n-1.5,10,5\n", "line 2", "'-1.5'"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0,-10,5\n", "line 2", "'-10'"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0,10,5\n\n2,10,0\n", "line 4", "'0'"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0,10.5,5\n", "line 2", "'10.5'"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0,10\n", "line 2", "missing field 'output_len'"),
    ("a.csv", "arrival_time,prompt_len,output_len,max_tokens\n0,10,5,0\n", "line 2", "max_tokens '0'"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0,10,5\nnan,10,5\n", "line 3", "'nan'"),
    ("a.jsonl", '{"arrival_time": 0, "prompt_len": 10}\n', "line 1", "output_len"),
    ("a.jsonl", '{"arrival_time": 0, "prompt_len": 10, "output_len": 5}\n{"arrival_time": 1, "prompt_len": "x", "output_len": 5}\n', "line 2", "'x'"),
    ("a.jsonl", '{"arrival_time": 0, "prompt_len": 10, "output_len": 0}\n', "line 1", "output_len 0"),
    ("a.jsonl", '{"arrival_time": 0, "prompt_len": 10, "output_len": 5}\n{"arrival_time": 0, \n', "line 2", "not JSON"),
    ("a.jsonl", '[0, 10, 5]\n', "line 1", "[0, 10, 5]"),
    ("a.jsonl", '{"arrival_time": true, "prompt_len": 10, "output_len": 5}\n', "line 1", "True"),
    ("a.csv", "", "line 1", "empty"),
]


@pytest.mark.parametrize("filename, text, line, value", BAD_FILES)
def test_bad_user_file_names_file_line_and_value(tmp_path, filename, text, line, value):
    path = tmp_path / filename
    path.write_text(text)
    with pytest.raises(KvlabError) as info:
        load_workload(str(path))
    message = str(info.value)
    assert str(path) in message and line in message and value in message


def test_user_file_with_only_a_header_is_an_error(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("arrival_time,prompt_len,output_len\n")
    with pytest.raises(KvlabError, match="no requests"):
        load_workload(str(path))


@pytest.mark.parametrize(
    "spec, match",
    [("no-such-workload", "unknown workload 'no-such-workload'"), ("/nowhere/x.csv", "no such file")],
)
def test_unknown_spec_is_an_error(spec, match):
    with pytest.raises(KvlabError, match=match):
        load_workload(spec)


def test_wrong_suffix_is_an_error(tmp_path):
    path = tmp_path / "requests.txt"
    path.write_text("arrival_time,prompt_len,output_len\n0,1,1\n")
    with pytest.raises(KvlabError, match=r"\.csv or \.jsonl"):
        load_workload(str(path))


# --- contradictions and bad options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, options, match",
    [
        ("azure-conv", {"arrival": "trace", "rate": 2.0}, "--rate 2 contradicts --arrival trace"),
        ("paper-sharegpt", {"arrival": "burst", "rate": 2.0}, "--rate 2 contradicts --arrival burst"),
        ("arxiv", {"arrival": "trace"}, "no arrival times"),
        ("paper-sharegpt", {}, "give --rate"),
        ("paper-sharegpt", {"rate": 1.0, "cv": 2.0}, "only to --arrival gamma"),
        ("paper-sharegpt", {"rate": 1.0, "arrival": "gamma", "cv": 0.0}, "--cv 0 is out of range"),
        ("paper-sharegpt", {"rate": -1.0}, "--rate -1 is out of range"),
        ("paper-sharegpt", {"rate": 1.0, "arrival": "uniform"}, "--arrival 'uniform' is not an arrival process"),
        ("paper-sharegpt", {"rate": 1.0, "num_requests": 0}, "--num-requests 0"),
        ("paper-sharegpt", {"rate": 1.0, "duration": 0.0}, "--duration 0"),
        ("paper-sharegpt", {"rate": 1.0, "seed": -1}, "--seed -1"),
        ("azure-conv", {"num_requests": 20_000}, "19,366 requests"),
    ],
)
def test_contradictions_and_bad_options_are_reported(spec, options, match):
    with pytest.raises(KvlabError, match=match):
        load_workload(spec, **options)


def test_duration_before_the_first_arrival_is_an_error(tmp_path):
    path = tmp_path / "late.csv"
    path.write_text("arrival_time,prompt_len,output_len\n5.0,10,5\n6.0,10,5\n")
    assert load_workload(str(path), duration=5.5).requests == (Request(0, 5.0, 10, 5),)
    with pytest.raises(KvlabError, match="no request of late.csv arrives before --duration 1 s"):
        load_workload(str(path), duration=1.0)


def test_a_file_whose_requests_arrive_at_once_has_no_rate_to_borrow(tmp_path):
    path = tmp_path / "together.jsonl"
    path.write_text('{"arrival_time": 1, "prompt_len": 4, "output_len": 2}\n' * 3)
    with pytest.raises(KvlabError, match="give --rate"):
        load_workload(str(path), arrival="poisson")
    with pytest.raises(KvlabError, match="same moment"):
        load_workload(str(path), rate=2.0)
    assert load_workload(str(path), arrival="poisson", rate=2.0, num_requests=7).num_requests == 7


def test_workload_properties():
    workload = load_workload("llmservingsim-sharegpt", num_requests=10)
    assert workload.num_requests == 10
    assert workload.duration == workload.requests[-1].arrival_time
    assert workload.mean_prompt_len == sum(r.prompt_len for r in workload.requests) / 10
    assert workload.mean_output_len == sum(r.output_len for r in workload.requests) / 10
    assert workload.request_rate == 10 / workload.duration
