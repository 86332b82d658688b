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
