"""The fewest-replicas search as steps (kvlab.fleet.counts) against kvlab.fleet.fewest_replicas: the same counts
judged in the same order and the same answer, for any threshold at which a count starts to hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvlab.fleet import capacity as fleet_capacity
from kvlab.fleet import counts


def _steps(threshold: int | None, first: int, max_replicas: int) -> tuple[list[int], int | None]:
    search = counts.CountSearch(first=first, max_replicas=max_replicas)
    order = []
    while (n := search.next_count()) is not None:
        order.append(n)
        search.record(n, threshold is not None and n >= threshold)
    return order, search.num_replicas


def _fewest_replicas(threshold: int | None, first: int, max_replicas: int, monkeypatch) -> tuple[list[int], int | None]:
    """fewest_replicas itself, its fleet runs replaced by the count they were asked for."""
    order: list[int] = []

    def run_fleet(strategy, config, workload, spec, n, **options):
        order.append(n)
        return n

    monkeypatch.setattr(fleet_capacity, "run_fleet", run_fleet)
    search = fleet_capacity.fewest_replicas(None, None, "round-robin", None,
                                            lambda n: threshold is not None and n >= threshold, first=first,
                                            max_replicas=max_replicas)
    return order, search.num_replicas


@given(threshold=st.one_of(st.none(), st.integers(1, 200)), first=st.integers(1, 8), extra=st.integers(0, 150))
def test_the_steps_judge_what_fewest_replicas_judges(threshold, first, extra):
    import pytest

    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _steps(threshold, first, first + extra) == _fewest_replicas(threshold, first, first + extra, monkeypatch)


def test_exact_counts():
    assert _steps(5, 1, 64) == ([1, 2, 4, 8, 6, 5], 5)
    assert _steps(1, 1, 64) == ([1], 1)
    assert _steps(None, 1, 5) == ([1, 2, 4, 5], None)
    assert _steps(3, 2, 64) == ([2, 4, 3], 3)
