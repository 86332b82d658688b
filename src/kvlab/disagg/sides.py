"""The two sides of a disaggregated fleet: each replica is kvlab's engine (``kvlab.sim.Simulation`` with its
``RunScheduler``), unchanged but for its paged memory, which plays the KV connector's part in vLLM
(vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).

    prefill   the request runs with max_tokens=1 (the proxy's prefill request). When it has its token it finishes,
              but its blocks stay (``SendingAllocator``: NixlConnector.request_finished returns delay_free_blocks)
              until its KV has crossed the link; then they are freed (the decode side's notification).
    link      it starts when the iteration that sampled the token ends; it takes
              DisaggConfig.transfer_seconds(the request's blocks): latency + bytes / bandwidth.
    decode    the request, as the client sent it, reaches a decode replica when the transfer ends. At admission it
              finds its prompt's KV there (``ReceivingAllocator``: get_num_new_matched_tokens returns the prompt's
              tokens after the local prefix-cache hit; vLLM's scheduler then allocates blocks for all of them and
              counts them computed, less the last prompt token, computed again to sample the first token
              (_update_waiting_for_remote_kv)). After a preemption the KV is gone: the prompt is computed locally.

    prefill replica  ──[prompt]──▶ token 1 ─┬─ blocks held ───────────────┐ freed
                                            └─ link: latency + bytes / bw ─┴─▶ decode replica: blocks for the prompt,
                                                                                 1 token computed, then decode
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import NamedTuple

from kvlab.config.engine import SimConfig
from kvlab.disagg.config import DisaggConfig
from kvlab.memory.base import Fit
from kvlab.memory.paged import PagedAllocator
from kvlab.sched.output import SchedulerOutput
from kvlab.sched.seq import Seq, num_tokens_to_finish
from kvlab.sim import MAX_RUN_ITERATIONS, Simulation
from kvlab.strategies import Strategy
from kvlab.workload import Workload


class Transfer(NamedTuple):
    """One request's KV crossing the link: from prefill replica ``prefill_replica``, started at ``start`` (its
    prefill's end), done at ``end`` (its blocks freed there, its request at the decode side)."""

    request_id: int
    prefill_replica: int
    start: float
    end: float
    num_blocks: int
    num_bytes: int


class SendingAllocator(PagedAllocator):
    """Paged memory whose finished requests keep their blocks until ``release``: a request is finished on the
    prefill side when it has its one token (it is freed then only if it never got there: preempted, aborted)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False, *,
                 max_model_len: int | None = None) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching, max_model_len=max_model_len)
        self.outbox: list[tuple[Seq, int]] = []  # (finished request, its blocks) not yet on the link
        self.num_held_blocks = 0  # blocks of requests whose KV is leaving

    def free(self, seq) -> None:
        request_id = seq.request.request_id
        table = self._block_tables.get(request_id)
        if table is not None and num_tokens_to_finish(seq) == 0:
            self.outbox.append((seq, len(table)))
            self.num_held_blocks += len(table)
            return
        super().free(seq)

    def release(self, seq: Seq, num_blocks: int) -> None:
        """The request's KV has left: its blocks are freed."""
        self.num_held_blocks -= num_blocks
        super().free(seq)


class ReceivingAllocator(PagedAllocator):
    """Paged memory that finds each request's prompt KV sent from a prefill replica at its first admission."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, *,
                 max_model_len: int | None = None) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching, max_model_len=max_model_len)
        self._remote: dict[int, int] = {}  # request_id -> tokens its lookup found sent (not yet allocated)
        self._received: set[int] = set()  # requests whose sent KV was taken (a preempted one recomputes)
        self.num_received_tokens = 0
        self.num_local_hit_tokens = 0

    def get_num_cached_tokens(self, seq) -> int:
        """The local prefix-cache hit, then the prompt's sent KV up to its last token (vLLM: local + external)."""
        local = super().get_num_cached_tokens(seq)
        request_id = seq.request.request_id
        if request_id in self._received:
            return local
        remote = max(0, seq.request.prompt_len - 1 - local)
        self._remote[request_id] = remote
        return local + remote

    def _allocate_first(self, seq, num_new_tokens: int, num_cached_tokens: int, watermark_blocks: int = 0) -> Fit:
        request_id = seq.request.request_id
        remote = self._remote.pop(request_id, 0) if num_cached_tokens else 0
        local = num_cached_tokens - remote
        # (as vLLM's allocate_slots(num_new_tokens + num_external_computed_tokens, num_new_local_computed_tokens))
        fit = super()._allocate_first(seq, num_new_tokens + remote, local, watermark_blocks)
        if fit is Fit.NOW and request_id not in self._received:
            self._received.add(request_id)
            self.num_received_tokens += remote
            self.num_local_hit_tokens += local
        return fit

    def free(self, seq) -> None:
        super().free(seq)
        self._remote.pop(seq.request.request_id, None)


def _paged(cls, config: SimConfig, strategy: Strategy):
    cache = config.cache
    return cls(cache.num_slots // cache.block_size, cache.block_size, strategy.enable_prefix_caching,
               max_model_len=config.scheduler.max_model_len)


class PrefillSimulation(Simulation):
    """A prefill replica: the engine, stepping one iteration at a time (a transfer's end frees blocks between any
    two iterations, as an arrival joins), with the link's transfers in flight beside it."""

    def __init__(self, strategy: Strategy, config: SimConfig, workload: Workload, disagg: DisaggConfig,
                 replica: int, *, start_time: float, record_iterations: bool = True) -> None:
        super().__init__(strategy, config, workload, record_iterations=record_iterations, max_iterations=1,
                         start_time=start_time, allocator=_paged(SendingAllocator, config, strategy))
        self.disagg = disagg
        self.replica = replica
        self.in_flight: list[tuple[float, int, Seq, int]] = []  # (end, request_id, request, blocks): a heap
        self.transfers: list[Transfer] = []  # every transfer, in the order they started

    def step(self) -> SchedulerOutput | None:
        out = super().step()
        self._send()
        return out

    def finish_transfers(self) -> None:
        """Let every transfer still in flight end (after the last iteration): their blocks are freed."""
        self._release(float("inf"))

    def _send(self) -> None:
        """The requests that got their token in the iteration just ended: their KV goes on the link."""
        allocator = self.allocator
        assert isinstance(allocator, SendingAllocator)
        for seq, num_blocks in allocator.outbox:
            start = seq.finish_time
            assert start is not None
            end = start + self.disagg.transfer_seconds(num_blocks)
            heappush(self.in_flight, (end, seq.request_id, seq, num_blocks))
            self.transfers.append(Transfer(seq.request_id, self.replica, start, end, num_blocks,
                                           num_blocks * self.disagg.block_bytes))
        allocator.outbox.clear()

    def _arrive(self) -> None:
        """Transfers that ended free their blocks, then arrivals join, before the next iteration is scheduled. With
        nothing running and the head of the queue waiting for blocks held by transfers, the engine has nothing to
        schedule: the clock moves to the next transfer's end (and what arrives meanwhile joins), past ``run_until``'s
        limit if it must: a router reading the replica there sees it stalled, as it is until then."""
        self._release(self.now)
        super()._arrive()
        sched = self.scheduler
        while self.in_flight and not sched.running and sched.waiting and not self._head_fits():
            self.now = max(self.now, self.in_flight[0][0])
            self._release(self.now)
            super()._arrive()

    def _head_fits(self) -> bool:
        """Whether the free blocks hold the head of the queue's tokens (no prefix hit counted: with one, it might
        have fitted a little earlier)."""
        admission = self.allocator.admission(self.scheduler.waiting[0])
        return admission.num_slots <= admission.num_room_slots

    def _release(self, t: float) -> None:
        allocator, in_flight = self.allocator, self.in_flight
        assert isinstance(allocator, SendingAllocator)
        while in_flight and in_flight[0][0] <= t:
            _, _, seq, num_blocks = heappop(in_flight)
            allocator.release(seq, num_blocks)


def decode_simulation(strategy: Strategy, config: SimConfig, workload: Workload, *, start_time: float,
                      record_iterations: bool = True, max_iterations: int = MAX_RUN_ITERATIONS) -> Simulation:
    """A decode replica: the engine with memory that receives the prompts' KV (its runs of many iterations as any
    engine's; ``max_iterations=1`` steps, the reference tests/test_disagg.py holds them to)."""
    return Simulation(strategy, config, workload, record_iterations=record_iterations, start_time=start_time,
                      max_iterations=max_iterations, allocator=_paged(ReceivingAllocator, config, strategy))
