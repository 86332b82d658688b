"""A running request as the allocators see it (kvlab.memory.base.Sequence), for the allocator tests' tiny pools."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.workload.request import Request


@dataclass
class Seq:
    request: Request
    num_computed_tokens: int = 0
    num_tokens: int = field(default=0)  # prompt + output tokens so far

    def __post_init__(self):
        self.num_tokens = self.num_tokens or self.request.prompt_len


def decode_run(allocator, running: list[Seq], iterations: int) -> None:
    """A decode run of ``iterations`` on ``running`` (each starting where its tokens were computed), checked against the
    allocator's own count of the slots it takes (decode_run_slots, where it gives one), the tokens then computed."""
    for s in running:
        s.num_tokens = s.num_computed_tokens + 1
    expected = allocator.decode_run_slots(iterations)
    before = allocator.num_allocated_slots
    run = allocator.allocate_decode_run(running, iterations)
    if expected is not None:
        assert run.num_iterations == iterations and allocator.num_allocated_slots - before == expected
    for s in running:
        s.num_computed_tokens += run.num_iterations
        s.num_tokens = s.num_computed_tokens + 1
