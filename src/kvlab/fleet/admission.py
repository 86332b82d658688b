"""The gateway in front of the router: a token bucket and a bounded queue, deciding at each arrival whether a
request goes on to the router now, waits, or is rejected with a reason (docs/admission.md).

    arrival t ──▶ a token in the bucket, nobody queued? ──yes──▶ admitted at t ──▶ router
                        │ no
                        ▼
                  room in the queue? ──no──▶ rejected: "rate limited" (no queue) / "gateway queue full"
                        │ yes
                        ▼
                  waits until the bucket holds a token ──▶ admitted then ──▶ router; first come first served, or
                  by (priority, arrival) with queue_policy "priority" (or its client's deadline passes first:
                  aborted at the gateway)

The bucket holds ``burst`` tokens and gains ``rate`` a second (never more than ``burst``); it starts full. A request
admitted takes one token. The gateway reads nothing of the engines, so its decisions are a function of the arrivals
alone: ``admit`` runs it over the whole workload, in simulated time, before the router sees anything, and each
admitted request reaches the router at its admission time. ``Gate.as_seen_by_clients`` puts the records back on
the clients' clock (TTFT and end-to-end latency include the wait at the gateway), as kvlab.cost.latency does for a
profile's request latency.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from heapq import heappop, heappush

from kvlab.config.admission import AdmissionSpec
from kvlab.metrics import RequestRecord, distribution
from kvlab.workload.request import Request

INF = float("inf")
RATE_LIMITED = "rate limited"  # no token, and no gateway queue (a rate limiter's 429)
QUEUE_FULL = "gateway queue full"  # no token, and the queue holds max_queue requests already


@dataclass(frozen=True)
class Gate:
    """What the gateway decided for every request of a run. ``admitted``: the requests in the order they reach the
    router, each at its admission time (``arrival_time``; a deadline shortened by the wait); ``sent``: the arrival
    of each that waited, by request id; ``refused``: a record for each request that never reached the router
    (rejected, or aborted in the queue), on the clients' clock; ``latency_s``: how much later than its client's time
    each arrival is (a profile's request latency, kvlab.cost.latency)."""

    spec: AdmissionSpec
    num_offered: int
    admitted: tuple[Request, ...]
    sent: dict[int, float]
    refused: tuple[RequestRecord, ...]
    latency_s: float = 0.0

    @property
    def waits(self) -> dict[int, float]:
        """Seconds each request that waited spent in the queue, by request id."""
        return {r.request_id: r.arrival_time - self.sent[r.request_id] for r in self.admitted
                if r.request_id in self.sent}

    @property
    def num_rejected(self) -> int:
        return sum(1 for r in self.refused if r.status == "rejected")

    @property
    def num_aborted(self) -> int:
        return sum(1 for r in self.refused if r.status == "aborted")

    def summary(self) -> dict:
        """The run summary's ``admission`` entry (docs/metrics.md)."""
        rejected = self.num_rejected
        reasons: dict[str, int] = {}
        for r in self.refused:
            if r.reject_reason is not None:
                reasons[r.reject_reason] = reasons.get(r.reject_reason, 0) + 1
        waits = [self.waits.get(r.request_id, 0.0) for r in self.admitted]
        return {"gateway": self.spec.text, "num_offered": self.num_offered, "num_admitted": len(self.admitted),
                "num_queued": len(self.sent), "num_rejected": rejected,
                "rejected_share": rejected / self.num_offered if self.num_offered else 0.0,
                "reject_reasons": reasons, "num_aborted_in_queue": self.num_aborted,
                "gateway_wait_s": distribution(waits)}

    def as_seen_by_clients(self, records: list[RequestRecord]) -> list[RequestRecord]:
        """Records of admitted requests (on the clients' clock: kvlab.cost.latency.as_seen_by_clients) with the
        arrival of those that waited put back where their client sent them."""
        sent, latency_s = self.sent, self.latency_s
        if not sent:
            return records
        return [r._replace(arrival_time=sent[r.request_id] - latency_s) if r.request_id in sent else r
                for r in records]


class TokenBucket:
    """``burst`` tokens at most, ``rate`` more each second, full at the start."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.time = -INF

    def take(self, t: float) -> bool:
        """Take a token at ``t`` if the bucket holds one."""
        if self.time != t:
            self.tokens = min(self.burst, self.tokens + self.rate * (t - self.time))  # (full at the first: t + inf)
            self.time = t
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def next_token_time(self) -> float:
        """When the bucket next holds a whole token (now, if it does)."""
        return self.time if self.tokens >= 1 else self.time + (1 - self.tokens) / self.rate

    def take_at(self, t: float) -> None:
        """Take the token that ``next_token_time()`` promised, at ``t``: the bucket is then empty (set, not
        computed, so that a token every 1/rate seconds lands exactly there)."""
        self.tokens = 0.0
        self.time = t


def admit(spec: AdmissionSpec, requests: list[Request] | tuple[Request, ...], latency_s: float = 0.0) -> Gate:
    """Run the gateway over ``requests`` (in arrival order). ``latency_s``: how much later than its client's time
    each request's arrival is (a profile's request latency, kvlab.cost.latency); the refused records are put back
    on the clients' clock by it."""
    bucket = TokenBucket(spec.rate, spec.burst)
    # waiting, as a heap in release order: (priority or 0, arrival index, request); those gone are skipped at the head
    queue: list[tuple[int, int, Request]] = []
    by_priority = spec.queue_policy == "priority"
    deadlines: list[tuple[float, int]] = []  # (deadline, request id) of those waiting with one
    waiting: dict[int, Request] = {}  # request id -> request, of those waiting now
    admitted: list[Request] = []
    sent: dict[int, float] = {}
    refused: list[RequestRecord] = []

    def release(t: float) -> None:
        """Every event up to ``t``: queued requests admitted as tokens come, clients whose deadline passes leave."""
        while waiting:
            t_token = bucket.next_token_time()
            t_deadline = deadlines[0][0] if deadlines else INF
            if min(t_token, t_deadline) > t:
                return
            if t_deadline <= t_token:  # (a client whose deadline comes with the token has left)
                _, request_id = heappop(deadlines)
                if request_id in waiting:
                    refused.append(_record(waiting.pop(request_id), "aborted", None, t_deadline, latency_s))
                continue
            while queue[0][2].request_id not in waiting:
                heappop(queue)
            request = waiting.pop(heappop(queue)[2].request_id)
            bucket.take_at(t_token)
            wait = t_token - request.arrival_time
            sent[request.request_id] = request.arrival_time
            timeout = None if request.timeout is None else request.timeout - wait
            admitted.append(replace(request, arrival_time=t_token, timeout=timeout))

    for index, request in enumerate(requests):
        t = request.arrival_time
        release(t)
        if not waiting and bucket.take(t):
            admitted.append(request)
        elif len(waiting) < spec.max_queue:
            heappush(queue, (request.priority if by_priority else 0, index, request))
            waiting[request.request_id] = request
            if request.timeout is not None:
                heappush(deadlines, (t + request.timeout, request.request_id))
        else:
            refused.append(_record(request, "rejected", QUEUE_FULL if spec.max_queue else RATE_LIMITED, None,
                                   latency_s))
    release(INF)
    return Gate(spec, len(requests), tuple(admitted), sent, tuple(refused), latency_s)


def _record(request: Request, status: str, reason: str | None, finish: float | None,
            latency_s: float) -> RequestRecord:
    return RequestRecord(request_id=request.request_id, arrival_time=request.arrival_time - latency_s,
                         prompt_len=request.prompt_len, num_output_tokens=request.num_output_tokens, status=status,
                         first_scheduled_time=None, first_token_time=None, finish_time=finish, num_preemptions=0,
                         reject_reason=reason)
