"""The fewest-replicas search as steps: which count to judge next, given the verdicts so far.

    holds  ✗ at N  → next 2N (at most max_replicas)   (until a count holds, or max_replicas failed: no answer)
    holds  ✓ at N  → bisect between the last count that failed and N (the first that held)

The one home of the rule, written so that a caller can judge each count where it likes: kvlab.fleet.fewest_replicas
runs each count as a fleet in its own process; the service (kvlab.service.replicas) judges them as sweep points,
stored, so that a stopped search resumes from the counts already judged. tests/test_fleet_counts.py holds the
steps to what the search must find for any count at which the replicas start to hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.errors import KvlabError


@dataclass
class CountSearch:
    """One search over the replica count. ``next_count()`` says what to judge; ``record()`` takes the verdict."""

    first: int = 1
    max_replicas: int = 64
    held: dict[int, bool] = field(default_factory=dict)  # every count judged, in the order judged
    failed: int = 0  # the highest count that failed below the answer (0: none yet)
    num_replicas: int | None = None  # the fewest that held so far (None: none yet)

    def __post_init__(self) -> None:
        if self.max_replicas < self.first:
            raise KvlabError(f"--max-replicas {self.max_replicas} is below the first count tried ({self.first}); "
                             f"valid: {self.first} or more")

    def next_count(self) -> int | None:
        """The next count to judge, or None when the search is over."""
        if not self.held:
            return self.first
        if self.num_replicas is None:
            last = next(reversed(self.held))
            return None if last >= self.max_replicas else min(2 * last, self.max_replicas)
        if self.num_replicas - self.failed > 1 and self.failed >= self.first:
            return (self.failed + self.num_replicas) // 2
        return None

    def record(self, n: int, held: bool) -> None:
        self.held[n] = held
        if held:
            self.num_replicas = n if self.num_replicas is None else min(self.num_replicas, n)
        else:
            self.failed = max(self.failed, n)

    @property
    def tried(self) -> list[int]:
        return sorted(self.held)
