"""The bench workload (kvlab.service.bench): `kvlab run`'s workload bounded to DEFAULT_NUM_REQUESTS by default (drawn
that many times, or a trace's first rows), each answer capped to the server's max_model_len."""

from __future__ import annotations

from kvlab.service.bench import DEFAULT_NUM_REQUESTS, bench_workload


def _workload(name: str, **given):
    options = {"rate": None, "arrival": "auto", "cv": 1.0, "num_requests": None, "duration": None, "seed": 0,
               "max_model_len": 2048, **given}
    return bench_workload(name, **options)


def test_a_drawn_workload_is_drawn_the_default_number_of_times():
    wl = _workload("paper-sharegpt")
    assert wl.num_requests == DEFAULT_NUM_REQUESTS == 100
    assert all(r.prompt_len + (r.output_len if r.max_tokens is None else r.max_tokens) <= 2048 for r in wl.requests)
    assert _workload("paper-sharegpt", num_requests=7).num_requests == 7


def test_a_trace_keeps_its_times_and_serves_its_first_rows():
    wl = _workload("azure-conv")
    assert wl.num_requests == DEFAULT_NUM_REQUESTS
    assert wl.description.endswith(f"the first {DEFAULT_NUM_REQUESTS} (give -n or --duration for more)")
    longer = _workload("azure-conv", num_requests=150)
    assert longer.num_requests == 150
    assert [r.arrival_time for r in longer.requests[:DEFAULT_NUM_REQUESTS]] == [r.arrival_time for r in wl.requests]



BENCH_DOWN = ("bench", "--url", "http://127.0.0.1:9")  # nothing listens there (trial 48, finding 12)


def test_bad_workload_options_are_refused_before_the_server_is_contacted(kvlab):
    for args, words in ((["--rate", "0"], "--rate 0"), (["-n", "0"], "--num-requests 0"),
                        (["--duration", "0"], "--duration 0"), (["--arrival", "weird"], "--arrival 'weird'"),
                        (["--cv", "-1"], "--cv -1"), (["-w", "nope"], "unknown workload 'nope'")):
        result = kvlab(*BENCH_DOWN, *args)
        assert result.exit_code == 2, (args, result.stderr)
        assert words in result.stderr and "cannot reach" not in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_unknown_gpu_is_refused_without_an_option_bench_does_not_have(kvlab):
    result = kvlab(*BENCH_DOWN, "--compare", "--gpu", "zz")
    assert result.exit_code == 2 and "unknown GPU 'zz'" in result.stderr, result.stderr
    assert "--gpu-memory-gib" not in result.stderr and "cannot reach" not in result.stderr
