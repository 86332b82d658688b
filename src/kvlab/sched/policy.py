"""Scheduling policies: the waiting queue's order and the preemption victim. vLLM's ``--scheduling-policy``.

    fcfs      the waiting queue is a deque: arrivals at the back, a preempted request back at the front; the
              victim is the newest running request, ``running[-1]`` (vllm/v1/core/sched/request_queue.py:
              FCFSRequestQueue; scheduler.py, Scheduler.schedule: ``self.running.pop()``).
    priority  the waiting queue is a heap ordered by (priority, arrival time), smaller first, a preempted request
              going back to its place, not the front; the victim is the running request with the largest
              (priority, arrival time), the lowest priority's latest arrival, wherever it is in the batch
              (request_queue.py: PriorityRequestQueue, ordered by vllm/v1/request.py's Request.__lt__;
              Scheduler.schedule: the max of ``self.running`` by (priority, arrival_time)). A victim
              already scheduled in this iteration gives its tokens back (the scheduler's running loop).

The priority queue answers to a deque's names (``append`` is vLLM's add_request, ``appendleft`` prepend_request,
``popleft`` pop_request, ``[0]`` peek_request) so that FCFS keeps a deque (with vLLM's ``remove_requests`` for
aborts), and the batching policies read either the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from heapq import heapify, heappop, heappush
from typing import NamedTuple

from kvlab.sched.seq import Seq


class PriorityQueue:
    """vLLM's PriorityRequestQueue: a heap of (priority, arrival time, request id, request). Iterating yields the
    requests in the order they would be popped."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Seq]] = []

    def append(self, seq: Seq) -> None:
        request = seq.request
        heappush(self._heap, (request.priority, request.arrival_time, request.request_id, seq))

    appendleft = append  # (a priority queue has no front to prepend to: vLLM's prepend_request adds)

    def popleft(self) -> Seq:
        return heappop(self._heap)[3]

    def __getitem__(self, index: int) -> Seq:
        if index != 0:
            raise IndexError("a priority queue is read at its head only")
        return self._heap[0][3]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Seq]:
        return (entry[3] for entry in sorted(self._heap))

    def __repr__(self) -> str:
        return f"PriorityQueue({list(self)!r})"

    def remove_requests(self, leaving: set[int]) -> None:
        """Remove the requests whose ``id()`` is in ``leaving`` (vLLM's remove_requests: filter, heapify)."""
        self._heap = [entry for entry in self._heap if id(entry[3]) not in leaving]
        heapify(self._heap)


class FCFSQueue(deque):
    """vLLM's FCFSRequestQueue: a deque, and the removal of aborted requests (O(n): aborts are rare)."""

    __slots__ = ()

    def remove_requests(self, leaving: set[int]) -> None:
        kept = [seq for seq in self if id(seq) not in leaving]
        self.clear()
        self.extend(kept)


# What the scheduler's ``waiting`` is, as the batching policies read it (a head, popped from the left).
WaitingQueue = FCFSQueue | PriorityQueue


def _newest(running: list[Seq]) -> int:
    return len(running) - 1


def _lowest_priority(running: list[Seq]) -> int:
    """The running request with the largest (priority, arrival time, request id). vLLM keys on (priority,
    arrival_time) alone, but its arrival times are the wall clock at each add_request and never tie; a workload's
    may (a burst), and kvlab adds tied requests in request-id order, so the id stands for the later addition."""
    best = 0
    first = running[0].request
    best_key = (first.priority, first.arrival_time, first.request_id)
    for index in range(1, len(running)):
        request = running[index].request
        key = (request.priority, request.arrival_time, request.request_id)
        if key > best_key:
            best, best_key = index, key
    return best


class Policy(NamedTuple):
    name: str
    make_queue: type[FCFSQueue] | type[PriorityQueue]
    victim_index: Callable[[list[Seq]], int]  # the index in ``running`` of the request to preempt
    # Arrivals join the queue behind its head: one the batching policy cannot admit yet stays the head until
    # something finishes (what lets kvlab.sched.runs run past arrivals while the head waits).
    arrivals_join_behind: bool


POLICIES = {
    "fcfs": Policy("fcfs", FCFSQueue, _newest, True),
    "priority": Policy("priority", PriorityQueue, _lowest_priority, False),
}
