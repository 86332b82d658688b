"""The gateway in front of the router as configured: a token bucket (its rate and burst) and a bounded queue
(kvlab.fleet.admission runs it; docs/admission.md).

Parsed here, in the configuration, so that resolving ``--rate-limit`` never imports the fleet (as
kvlab.config.router does for ``--router``). The options' ranges (rate > 0, burst >= 1, queue >= 0) are checked
with every other option's (kvlab.validate, from config/options.py); what spans two options is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvlab.errors import KvlabError

QUEUE_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True, slots=True)
class AdmissionSpec:
    """A gateway that admits at most ``rate`` requests per second on average and ``burst`` at once (a token bucket
    that holds ``burst`` tokens, refilled at ``rate`` a second, one token per request admitted), and holds at most
    ``max_queue`` requests waiting for a token (0: a request that finds no token is rejected at once), released in
    arrival order (``queue_policy`` "fcfs") or by (priority, arrival), smaller first ("priority")."""

    rate: float
    burst: int = 1
    max_queue: int = 0
    queue_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise KvlabError(f"--rate-limit {self.rate!r}: valid: requests per second > 0")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise KvlabError(f"--rate-limit-burst {self.burst!r}: valid: a whole number of requests, 1 or more")
        if isinstance(self.max_queue, bool) or not isinstance(self.max_queue, int) or self.max_queue < 0:
            raise KvlabError(f"--gateway-queue {self.max_queue!r}: valid: a whole number of requests, 0 or more")
        if self.queue_policy not in QUEUE_POLICIES:
            raise KvlabError(f"--gateway-queue-policy {self.queue_policy!r}: valid: {', '.join(QUEUE_POLICIES)}")

    @property
    def text(self) -> str:
        """How reports name it: ``2 req/s, burst 4, queue 8`` (``queue 8 by priority``)."""
        policy = " by priority" if self.queue_policy == "priority" and self.max_queue else ""
        return f"{self.rate:g} req/s, burst {self.burst}, queue {self.max_queue}{policy}"


def resolve_admission(values: dict[str, Any]) -> AdmissionSpec | None:
    """The gateway from the options (None: off, every request goes straight to the router). A burst or a queue
    without a rate limit is refused: nothing would ever wait or be refused."""
    rate = values.get("rate_limit")
    if rate is None:
        for name in ("rate_limit_burst", "gateway_queue", "gateway_queue_policy"):
            if values.get(name) is not None:
                raise KvlabError(f"--{name.replace('_', '-')} needs --rate-limit: valid: --rate-limit REQUESTS_PER_S "
                                 "(> 0) with it")
        return None
    burst, queue, policy = values.get("rate_limit_burst"), values.get("gateway_queue"), values.get("gateway_queue_policy")
    if policy == "priority" and not queue:  # (AdmissionSpec.text: a policy orders a queue, and there is none)
        raise KvlabError("--gateway-queue-policy priority orders the gateway's queue, and --gateway-queue "
                         f"{queue or 0} gives it none; valid: --gateway-queue N (N > 0) with it")
    return AdmissionSpec(rate, 1 if burst is None else burst, 0 if queue is None else queue, policy or "fcfs")


def admission_options(spec: AdmissionSpec | None) -> dict[str, Any]:
    """The options a gateway came from (none when off: stored configurations' keys stay as they were)."""
    if spec is None:
        return {}
    return {"rate_limit": spec.rate, "rate_limit_burst": spec.burst, "gateway_queue": spec.max_queue,
            **({"gateway_queue_policy": spec.queue_policy} if spec.queue_policy != "fcfs" else {})}
