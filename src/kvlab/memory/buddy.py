"""A binary buddy allocator over a linear address space of KV slots.

The vLLM paper (§3, Figure 2) assumes the systems before it placed each request's contiguous KV slab with a
buddy allocator; kvlab places slabs with a real one, so external fragmentation happens instead of being assumed.

The address space ``[0, num_slots)`` need not be a power of two. It is covered by its binary decomposition,
maximal power-of-two aligned regions in decreasing size; chunks never cross a region, so the remainder serves
only smaller requests::

    num_slots = 15,728 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 + 16
    |------- 8192 -------|--- 4096 ---|- 2048 -|1024|..|    at most seven 2,048-slot chunks

A chunk of order k has 2**k slots and starts at a multiple of 2**k; its buddy is at ``address ^ 2**k``. Any
aligned power-of-two range inside ``[0, num_slots)`` lies inside one region, so merging two free buddies never
crosses a region. Among the free chunks of an order, the lowest address is handed out first (a min-heap per
order), which keeps placement deterministic and packed toward address 0. Every operation is O(log num_slots).
"""

from __future__ import annotations

from heapq import heappop, heappush

from kvlab.errors import KvlabError
from kvlab.memory.base import Fit


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class BuddyAllocator:
    """Chunks of power-of-two sizes over ``num_slots`` slots, split on demand and coalesced on free."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise KvlabError(f"a buddy allocator needs at least 1 slot, got num_slots={num_slots}")
        self.num_slots = num_slots
        self.max_order = num_slots.bit_length() - 1
        # Free chunks per order: a set for O(1) buddy lookup, a heap for the lowest address. The heap may hold
        # stale addresses (merged or taken since); they are skipped when popped and pruned when they pile up.
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self._heap: list[list[int]] = [[] for _ in range(self.max_order + 1)]
        self._allocated: dict[int, int] = {}  # address -> order
        self.num_free_slots = num_slots
        self.regions: tuple[tuple[int, int], ...] = _binary_decomposition(num_slots)
        for address, size in self.regions:
            self._push(size.bit_length() - 1, address)

    @property
    def largest_region(self) -> int:
        """The largest chunk this address space can ever hand out."""
        return 1 << self.max_order

    @property
    def largest_free_chunk(self) -> int:
        """Size of the largest free chunk now (0 when full)."""
        for order in range(self.max_order, -1, -1):
            if self._free[order]:
                return 1 << order
        return 0

    def free_chunks(self) -> list[tuple[int, int]]:
        """Every free chunk as ``(address, size)``, in address order."""
        return sorted((address, 1 << order) for order, chunks in enumerate(self._free) for address in chunks)

    def allocated_chunks(self) -> list[tuple[int, int]]:
        """Every allocated chunk as ``(address, size)``, in address order."""
        return sorted((address, 1 << order) for address, order in self._allocated.items())

    def fit(self, size: int) -> Fit:
        """Whether a chunk for ``size`` slots can be handed out now, later (after frees), or never."""
        order = _order_for(size)
        if order > self.max_order:
            return Fit.NEVER
        for k in range(order, self.max_order + 1):
            if self._free[k]:
                return Fit.NOW
        return Fit.LATER

    def allocate(self, size: int) -> int:
        """The address of a new chunk of ``next_pow2(size)`` slots; call only when ``fit(size)`` is Fit.NOW."""
        order = _order_for(size)
        k = order
        while k <= self.max_order and not self._free[k]:
            k += 1
        if k > self.max_order:
            raise ValueError(f"no free chunk of {1 << order} slots: check fit({size}) first")
        address = self._pop_lowest(k)
        # Split down to the asked order; each split frees the upper half (the buddy).
        while k > order:
            k -= 1
            self._push(k, address + (1 << k))
        self._allocated[address] = order
        self.num_free_slots -= 1 << order
        return address

    def free(self, address: int) -> int:
        """Give back the chunk at ``address``, merging it with free buddies; returns the chunk's size."""
        order = self._allocated.pop(address)
        size = 1 << order
        self.num_free_slots += size
        while order < self.max_order:
            buddy = address ^ (1 << order)
            if buddy not in self._free[order]:
                break
            self._free[order].remove(buddy)  # its heap entry goes stale
            address = min(address, buddy)
            order += 1
        self._push(order, address)
        return size

    def chunk_size(self, address: int) -> int:
        return 1 << self._allocated[address]

    def _push(self, order: int, address: int) -> None:
        self._free[order].add(address)
        heap = self._heap[order]
        heappush(heap, address)  # (imported by name: compiled, reading it off the module was a generic lookup a call)
        if len(heap) > 2 * len(self._free[order]) + 64:
            # Prune stale entries; amortized O(1) per push.
            self._heap[order] = sorted(self._free[order])

    def _pop_lowest(self, order: int) -> int:
        free, heap = self._free[order], self._heap[order]
        while True:
            address = heappop(heap)
            if address in free:
                free.remove(address)
                return address


def _order_for(size: int) -> int:
    if size < 1:
        raise ValueError(f"a chunk needs at least 1 slot, got {size}")
    return (size - 1).bit_length()


def _binary_decomposition(num_slots: int) -> tuple[tuple[int, int], ...]:
    """``[0, num_slots)`` as maximal aligned power-of-two regions, largest first."""
    regions = []
    address = 0
    for order in range(num_slots.bit_length() - 1, -1, -1):
        if num_slots & (1 << order):
            regions.append((address, 1 << order))
            address += 1 << order
    return tuple(regions)
