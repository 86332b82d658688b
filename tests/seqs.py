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
