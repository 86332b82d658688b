"""The fewest-replicas rule (kvlab.fleet.counts, its one home) against what it must find: for any count at which the
replicas start to hold, the answer is that count (or the first tried, or none past the most allowed), one fewer
was judged and failed, no count is judged twice, and the judgements stay logarithmic. kvlab.fleet.fewest_replicas,
which runs each count as a fleet, is held to the same, count for count."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
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
    assert search.tried == sorted(order) and search.held == {n: threshold is not None and n >= threshold
                                                             for n in order}
    return order, search.num_replicas


def _check(order: list[int], found: int | None, threshold: int | None, first: int, max_replicas: int) -> None:
    """What any search over counts that start to hold at ``threshold`` must give."""
    holds = threshold is not None and threshold <= max_replicas
    assert found == (max(threshold, first) if holds else None)
    assert len(order) == len(set(order)) and all(first <= n <= max_replicas for n in order)
    assert order[0] == first
    if found is None:
        assert max_replicas in order  # (the most allowed was judged, and failed)
    elif found > first:
        assert found - 1 in order  # one fewer was judged, and failed
    # doublings from first to max_replicas, then a bisection of a gap below max_replicas
    assert len(order) <= math.ceil(math.log2(max_replicas / first)) + 1 + math.ceil(math.log2(max_replicas))


@given(threshold=st.one_of(st.none(), st.integers(1, 200)), first=st.integers(1, 8), extra=st.integers(0, 150))
def test_the_steps_find_the_count_where_replicas_start_to_hold(threshold, first, extra):
    order, found = _steps(threshold, first, first + extra)
    _check(order, found, threshold, first, first + extra)
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _fewest_replicas(threshold, first, first + extra, monkeypatch) == (order, found)


def test_exact_counts():
    assert _steps(5, 1, 64) == ([1, 2, 4, 8, 6, 5], 5)
    assert _steps(1, 1, 64) == ([1], 1)
    assert _steps(None, 1, 5) == ([1, 2, 4, 5], None)
    assert _steps(3, 2, 64) == ([2, 4, 3], 3)
    assert _steps(64, 1, 64) == ([1, 2, 4, 8, 16, 32, 64, 48, 56, 60, 62, 63], 64)


def test_a_most_below_the_first_is_refused_by_both():
    with pytest.raises(KvlabError, match="--max-replicas 1 is below the first count tried \\(2\\); valid: 2 or more"):
        counts.CountSearch(first=2, max_replicas=1)
    with pytest.raises(KvlabError, match="--max-replicas 1 is below the first count tried"):
        fleet_capacity.fewest_replicas(None, None, "round-robin", None, bool, first=2, max_replicas=1)


def test_the_rule_has_one_home():
    """fewest_replicas asks CountSearch for each count: no doubling or bisection of its own."""
    import inspect

    source = inspect.getsource(fleet_capacity.fewest_replicas)
    assert "CountSearch(" in source and "2 * " not in source and "// 2" not in source
