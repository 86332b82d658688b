"""Who won a race: one rule (kvlab.service.verdict) for `kvlab race`'s table and verdict (kvlab.report.tables) and
the lab's finish line (kvlab.web.session): a tie at 3 significant digits, as the race table prints throughputs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvlab.report import tables
from kvlab.service.verdict import same_throughput, tied, winner
from kvlab.web import session


def _summary(name: str, rps: float) -> dict:
    return {"name": name, "throughput_rps": rps, "num_finished": 100, "num_rejected": 0, "makespan_s": 100 / rps,
            "preemptions": 0, "recomputed_tokens": 0, "mean_batch_size": 8.0, "memory_shares": {"token": 50.0}}


def test_a_near_tie_is_a_tie_for_the_race_and_the_lab():
    """2.3412 and 2.3449 req/s both read 2.34: neither the race nor the lab names a winner (the lab once named the
    first, at exact equality only)."""
    race = [_summary("vllm", 2.3412), _summary("orca-max", 2.3449), _summary("static+max", 1.1)]
    assert same_throughput(2.3412, 2.3449) and tied(race) == ["vllm", "orca-max"]
    assert winner(race) is None and tables.winner(race) is None and session.winner(race) is None
    assert session.verdict(race).startswith("vllm and orca-max tied: each served")
    assert "orca-max and vllm (a tie) served the most" in tables.verdict(race)  # (the table ranks them)


def test_a_readable_difference_has_one_winner_for_both():
    race = [_summary("vllm", 2.36), _summary("orca-max", 2.34)]
    assert winner(race) == "vllm" == tables.winner(race)["name"] == session.winner(race)
    assert session.verdict(race).startswith("vllm served the most")
    assert tables.verdict(race).startswith("vllm served the most")


def test_one_strategy_wins_nothing():
    assert winner([_summary("vllm", 2.0)]) is None and tables.winner([_summary("vllm", 2.0)]) is None


@given(st.lists(st.floats(0.001, 1e4, allow_nan=False), min_size=2, max_size=5))
def test_the_race_and_the_lab_name_the_same_winner(rates):
    race = [_summary(f"s{i}", r) for i, r in enumerate(rates)]
    lab = session.winner(race)
    cli = tables.winner(race)
    assert lab == (None if cli is None else cli["name"])
    if lab is not None:  # the winner's throughput reads higher than everyone else's
        best = next(s for s in race if s["name"] == lab)["throughput_rps"]
        assert all(not same_throughput(s["throughput_rps"], best) for s in race if s["name"] != lab)
