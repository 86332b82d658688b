"""kvlab.window: the measured window, served ÷ offered, the queue across it, stable / backlogged / overloaded, and
whether the run loaded the engine; on hand-made request records with exact times."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.metrics import RequestRecord
from kvlab.window import latencies, measure


def _record(i: int, arrival: float, scheduled: float, finish: float | None, *, outputs: int = 10) -> RequestRecord:
    status = "finished" if finish is not None else "rejected"
    first_token = None if finish is None else scheduled + 0.01
    return RequestRecord(i, arrival, 100, outputs, status, None if finish is None else scheduled, first_token,
                         finish, 0)


def _steady(n: int, latency: float) -> list[RequestRecord]:
    """One arrival per second, each served at once in ``latency`` seconds."""
    return [_record(i, float(i), float(i), i + latency) for i in range(n)]


def test_the_window_is_the_arrivals_after_a_20_percent_warm_up_and_before_the_last_10_percent():
    w = measure(_steady(101, 0.5), seats=10)  # arrivals 0..100
    assert (w.start_s, w.end_s) == (20.0, 90.0)
    assert w.num_arrived == 71  # 20, 21, ..., 90
    assert w.latency_growth == 0.0  # each waits 0.5 s, the last as the first
    assert w.state == "stable" and w.sustained and w.loaded  # 71 arrivals, 10 seats
    assert w.served_share == 1.0


def test_an_engine_that_serves_half_the_arrivals_is_overloaded():
    # One arrival per second, finishing at two seconds apart: the engine serves 0.5 req/s.
    records = [_record(i, float(i), float(i), 2.0 * i + 1) for i in range(101)]
    w = measure(records, seats=1000)
    assert w.state == "overloaded" and not w.sustained
    assert w.latency_growth == 1.0  # the i-th waits i + 1 s: a second more for each second of arrivals
    assert w.served_share == 0.5


def test_a_queue_that_grows_while_nearly_everything_is_served_is_backlogged():
    # Served as they arrive for the first part of the window, then scheduling lags further and further behind
    # while each still finishes in order: the queue grows, served ÷ offered stays high.
    records = []
    for i in range(1001):
        lag = max(0.0, (i - 500) * 0.05)  # from arrival 500 on, each waits 0.05 s longer than the one before
        records.append(_record(i, float(i), i + lag, i + lag + 0.5))
    w = measure(records, seats=1000)
    assert w.served_share >= 0.95
    assert w.queue_second_half > w.queue_first_half + 0.01 * w.num_arrived
    assert w.state == "backlogged" and not w.sustained


def test_few_requests_of_an_engine_that_keeps_up_read_as_served_whatever_their_answers_lengths():
    # 30 arrivals a second apart, answers of 0.2 to 20 s in no order: finishes over a short window do not match its
    # arrivals one for one, but no wait grows.
    lengths = [0.2, 20.0, 3.0, 0.5, 11.0, 1.0, 7.0, 0.3, 15.0, 2.0]
    records = [_record(i, float(i), float(i), i + lengths[i % len(lengths)]) for i in range(30)]
    w = measure(records, seats=5)
    assert w.served_share >= 0.95 and w.state == "stable"


def test_a_window_with_fewer_arrivals_than_seats_is_not_loaded():
    w = measure(_steady(101, 0.5), seats=200)
    assert w.state == "stable" and not w.loaded


def test_refused_requests_are_counted_and_their_latencies_meet_nothing():
    records = _steady(101, 0.5)
    records[50] = _record(50, 50.0, 0.0, None)  # refused: no times
    w = measure(records, seats=10)
    assert w.num_rejected == 1 and not w.sustained
    lat = latencies(records, w)
    assert lat.shape == (4, 71)
    column = [r.request_id for r in records if w.start_s <= r.arrival_time <= w.end_s].index(50)
    assert all(math.isinf(v) for v in lat[:, column])


def test_a_one_token_answer_has_no_tpot():
    records = [_record(i, float(i), float(i), i + 0.5, outputs=1) for i in range(20)]
    lat = latencies(records, measure(records, seats=1))
    assert all(math.isnan(v) for v in lat[1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5), st.floats(0.01, 5)), min_size=1, max_size=60),
       st.integers(1, 100))
def test_invariants_on_any_run(times, seats):
    records = [_record(i, a, a + wait, a + wait + service) for i, (a, wait, service) in enumerate(times)]
    w = measure(records, seats)
    assert w.start_s <= w.end_s
    assert 0 <= w.num_arrived <= len(records) and 0 <= w.served_share <= 1
    assert w.queue_first_half >= 0 and w.queue_second_half >= 0
    assert w.state in ("stable", "backlogged", "overloaded")
    assert w.loaded == (w.num_arrived > seats)
    assert latencies(records, w).shape == (4, w.num_arrived)
    if w.state != "overloaded":
        assert w.served_share >= 0.95 and w.num_arrived > 0
