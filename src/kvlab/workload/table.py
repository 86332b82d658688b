"""A workload source's rows as numpy arrays, and the seeded draw of rows from it.

Every source (a bundled trace, a stand-in, a user's file) is read into one ``LengthTable``: one entry per
request, in arrival order when the source has arrival times. Turning rows into ``Request`` objects happens
once, at the end (``load.py``), so everything before it stays vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class LengthTable:
    """Rows of a source. Arrays are read-only: tables are cached and shared within a process.

    ``arrival_time`` is in seconds from the first request (sorted), or None for a lengths-only source.
    ``max_tokens`` (a user's file only) holds one entry per row, None where the row has no cap.
    ``prefix_hashes`` holds each row's prefix ids, ``prefix_chunk_len`` tokens each (Mooncake: 512-token blocks);
    ``prefix_len`` (conversations: kvlab.workload.sessions, a user's file with a session column) how many tokens
    of each row's prompt and answer they name (``Request.prefix_len``).
    ``num_skipped`` counts source rows that cannot be served as data (``skip_reason`` says why).
    ``num_out_of_order`` counts source rows that arrive earlier than the row before them (sorted here, stably).
    """

    prompt_len: np.ndarray
    output_len: np.ndarray
    arrival_time: np.ndarray | None = None
    max_tokens: tuple[int | None, ...] | None = None
    prefix_hashes: tuple[tuple[int, ...], ...] | None = None
    prefix_len: tuple[int, ...] | None = None
    prefix_chunk_len: int = 512
    # A user's file's ``priority`` column (vLLM's --scheduling-policy priority), one integer per row, or None.
    priority: tuple[int, ...] | None = None
    # A user's file's ``timeout`` column: each request's client deadline, seconds after its arrival, or None.
    timeout: tuple[float, ...] | None = None
    num_skipped: int = 0
    skip_reason: str = ""
    # Rows of the source that arrive earlier than the row before them (the table holds them in arrival order).
    num_out_of_order: int = 0

    def __post_init__(self) -> None:
        for array in (self.prompt_len, self.output_len, self.arrival_time):
            if array is not None:
                array.setflags(write=False)

    @property
    def num_rows(self) -> int:
        return len(self.prompt_len)

    @property
    def has_arrivals(self) -> bool:
        return self.arrival_time is not None

    @property
    def own_rate(self) -> float | None:
        """Mean arrival rate of the rows' own arrivals, (num_rows − 1) / span in requests/s.

        None without arrival times or when every row arrives at the same moment.
        """
        if self.arrival_time is None or self.num_rows < 2:
            return None
        span = float(self.arrival_time[-1] - self.arrival_time[0])
        return (self.num_rows - 1) / span if span > 0 else None

    @property
    def is_conversation(self) -> bool:
        """Rows are turns of conversations, in their order (each one's prefix names the turn before it)."""
        return self.prefix_len is not None

    def take(self, rows: np.ndarray) -> LengthTable:
        """The given rows, in the given order (arrival times dropped: the caller gives new ones)."""
        picked = rows.tolist()

        def column(values):
            return None if values is None else tuple(values[i] for i in picked)

        return LengthTable(
            prompt_len=self.prompt_len[rows],
            output_len=self.output_len[rows],
            max_tokens=column(self.max_tokens),
            prefix_hashes=column(self.prefix_hashes),
            prefix_len=column(self.prefix_len),
            prefix_chunk_len=self.prefix_chunk_len,
            priority=column(self.priority),
            timeout=column(self.timeout),
        )


def draw_rows(num_rows: int, num: int, rng: np.random.Generator) -> np.ndarray:
    """``num`` row indices: a fresh random permutation of all rows, pass after pass.

    Without replacement within a pass, so asking for every row gives every row once, and a small sample has
    no repeats. Each pass draws a whole permutation, so the first ``k`` indices do not depend on ``num``:
    a longer workload starts with the same requests as a shorter one of the same seed.
    """
    num_passes = -(-num // num_rows)
    return np.concatenate([rng.permutation(num_rows) for _ in range(num_passes)])[:num]


def sample_table(table: LengthTable, num: int, rng: np.random.Generator) -> LengthTable:
    """``num`` rows of ``table`` drawn with ``draw_rows``."""
    return table.take(draw_rows(table.num_rows, num, rng))


def out_of_order(times: np.ndarray) -> int:
    """How many of ``times`` (a file's order) are earlier than the one before them."""
    return int((np.diff(times) < 0).sum())
