"""A workload: the requests a simulation or a real engine is given, with where they came from."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.workload.request import Request


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, ``request_id`` 0..N−1.

    ``description`` says what was built (counts, arrivals, rate, skipped rows, caps); ``source`` says where
    the numbers come from (file, citation, licence), for a report's footnote.
    """

    name: str
    requests: tuple[Request, ...]
    description: str
    source: str

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def duration(self) -> float:
        """Seconds from t = 0 to the last arrival."""
        return self.requests[-1].arrival_time if self.requests else 0.0

    @property
    def request_rate(self) -> float:
        """Mean arrival rate in requests/s over ``duration`` (infinite when everyone arrives at t = 0)."""
        return self.num_requests / self.duration if self.duration > 0 else float("inf")

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        """Tokens the answers really have: true lengths, capped by each request's ``max_tokens``."""
        return sum(r.num_output_tokens for r in self.requests)

    @property
    def mean_prompt_len(self) -> float:
        return self.num_prompt_tokens / self.num_requests if self.requests else 0.0

    @property
    def mean_output_len(self) -> float:
        """Mean answer length as generated (``num_output_tokens``: true length capped by ``max_tokens``)."""
        return self.num_output_tokens / self.num_requests if self.requests else 0.0
