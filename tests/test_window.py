"""kvlab.window: the measured window, the queue (count and oldest wait) across it, served ÷ offered, stable / backlogged / overloaded, and
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


def _aborted(i: int, arrival: float, gave_up: float) -> RequestRecord:
    return RequestRecord(i, arrival, 100, 10, "aborted", None, None, gave_up, 0)


def test_the_window_is_the_arrivals_after_a_20_percent_warm_up_up_to_the_last():
    w = measure(_steady(101, 0.5), seats=10)  # arrivals 0..100
    assert (w.start_s, w.end_s) == (20.0, 100.0)
    assert w.num_arrived == 81  # 20, 21, ..., 100: the last arrivals are judged too
    assert w.oldest_wait_first_half_s == w.oldest_wait_second_half_s == 0.0  # nothing waits
    assert w.state == "stable" and w.sustained and w.loaded  # 81 arrivals, 10 seats
    assert w.served_share == 1.0 and w.decided_by.startswith("queue flat")
    assert w.drain_s == 0.5


def test_an_engine_that_schedules_half_the_arrivals_is_overloaded_by_the_oldest_wait():
    # One arrival per second, scheduled two seconds apart: the engine serves 0.5 req/s, and the oldest waiting
    # request has waited half the time elapsed (at t it is the one that arrived at t/2).
    records = [_record(i, float(i), 2.0 * i, 2.0 * i + 1) for i in range(101)]
    w = measure(records, seats=1000)
    assert w.state == "overloaded" and not w.sustained
    assert abs(w.wait_growth - 0.5) < 0.02 and abs(w.served_share - 0.5) < 0.02
    assert w.decided_by.startswith("oldest wait grew: served 5")


def test_a_disaggregated_fleets_decode_queue_is_judged_beside_its_prefill_queue():
    # Trial 46: the prefill side schedules every prompt on arrival and sends its KV 0.1 s later; the decode side
    # starts one request every two seconds. The clients' records show no prefill queue; the decode side's shows the
    # oldest wait growing half a second a second: served 50%, overloaded, as an aggregated engine would be.
    prefill = [_record(i, float(i), float(i), 2.0 * i + 2) for i in range(101)]
    decode = [_record(i, i + 0.1, 2.0 * i + 0.1, 2.0 * i + 2) for i in range(101)]
    alone = measure(prefill, seats=1000)
    assert alone.state == "stable"
    w = measure(prefill, seats=1000, decode_records=decode)
    assert w.state == "overloaded" and not w.sustained
    assert abs(w.decode_wait_growth - 0.5) < 0.02 and abs(w.served_share - 0.5) < 0.02
    assert w.decided_by.startswith("oldest wait grew: served 5") and "decode queue" in w.decided_by
    # A decode side that keeps up changes nothing but the words
    kept_up = measure(prefill, seats=1000, decode_records=[r._replace(first_scheduled_time=r.arrival_time)
                                                           for r in decode])
    assert (kept_up.state, kept_up.served_share, kept_up.queue_growth) == ("stable", 1.0, 0.0)


def test_longer_and_longer_answers_with_nothing_waiting_are_not_overloaded():
    # The trace: each request is scheduled on arrival, but each answer takes longer than the one before
    # (the latency grows by 0.5 s per second of arrivals). Nothing waits: the engine keeps up.
    records = [_record(i, float(i), float(i), i + 1 + 0.5 * i) for i in range(201)]
    w = measure(records, seats=10)
    assert w.state == "stable" and w.sustained and w.served_share == 1.0
    assert w.queue_first_half == w.queue_second_half == 0.0


def test_more_and_more_requests_waiting_no_longer_is_backlogged():
    # One arrival a second, then ten a second: each waits 5 s (the oldest wait is flat), but ten times as many
    # wait at once: the count grows.
    arrivals = [float(i) for i in range(100)] + [100 + i / 10 for i in range(1000)]
    records = [_record(i, a, a + 5.0, a + 6.0) for i, a in enumerate(arrivals)]
    w = measure(records, seats=10)
    assert w.served_share >= 0.95
    assert w.queue_second_half > w.queue_first_half + 0.01 * w.num_arrived
    assert w.state == "backlogged" and not w.sustained and w.decided_by.startswith("queue count grew")


def test_a_request_its_client_gave_up_on_is_counted_in_the_share_not_taken_for_overload():
    records = _steady(101, 0.5)
    records[90] = _aborted(90, 90.0, 95.0)
    w = measure(records, seats=10)
    assert (w.num_unfinished, w.num_aborted, w.num_arrived) == (0, 1, 81)
    assert w.state == "stable" and w.abandoned_share == 1 / 81
    assert w.decided_by.endswith("; 1 of 81 clients gave up at their deadline")
    assert w.to_dict()["abandoned_share"] == 1 / 81
    # Its latencies are left out: it got no answer to time (kvlab.sweep.slo judges it by the share).
    assert latencies(records, w).shape == (4, 80)


def test_with_deadlines_a_queue_whose_oldest_wait_grows_is_still_overload():
    # One arrival a second, scheduled two seconds apart; every fifth client gives up after 30 s of waiting: the
    # oldest wait of those still waiting grows all the same.
    records = [_aborted(i, float(i), i + 30.0) if i % 5 == 4 else _record(i, float(i), 2.0 * i, 2.0 * i + 1)
               for i in range(101)]
    w = measure(records, seats=1000)
    assert w.state == "overloaded" and w.num_aborted == 16 and w.decided_by.startswith("oldest wait grew")


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
    assert lat.shape == (4, 81)
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
    assert w.oldest_wait_first_half_s >= 0 and w.oldest_wait_second_half_s >= 0
    if w.state != "overloaded":
        assert w.served_share >= 0.95 and w.num_arrived > 0
    # Latency is never a signal: the same schedule with every answer ten times longer is judged the same
    longer = [r._replace(finish_time=r.first_scheduled_time + 10 * (r.finish_time - r.first_scheduled_time))
              for r in records]
    assert measure(longer, seats).state == w.state
