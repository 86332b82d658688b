"""Simulator state -> the compact frames the lab page draws.

A frame is JSON: the simulated clock and, per grid, the live counters, the slot usage (the five memory states)
and the blocks. Blocks travel as one base64 string of little-endian typed arrays, column after column, so the
page reads them through typed-array views without parsing anything per block:

    key frame    owner i32[n] | token u16[n] | reserved u16[n] | internal u16[n] | overhead u16[n] | shared u8[n]
    delta frame  index u32[m] | the same six columns for those m blocks only

Every column starts at a multiple of its element size (4n, 8n, 10n, ... bytes), which typed arrays require.
A delta carries the blocks that changed since the encoder's previous frame; the page keeps the last state and
patches it. Counts are u16 because a display block holds ``block_size`` slots and the server caps that far below
65,536 (params.LIMITS).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np

from kvlab.memory.base import BlockSnapshot, SlotUsage

# Column name, dtype. The order is the wire order; lab.js reads the same list (decodeBlocks).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("owner", "<i4"),
    ("token", "<u2"),
    ("reserved", "<u2"),
    ("internal_fragmentation", "<u2"),
    ("overhead", "<u2"),
    ("shared", "u1"),
)

# The counters the page shows under a grid, in the simulator's names.
COUNTER_KEYS = (
    "step",
    "num_running",
    "num_waiting",
    "num_finished",
    "num_rejected",
    "num_preemptions",
    "num_recomputed_tokens",
    "num_swapped_bytes",
    "num_output_tokens",
    "throughput_tps",
)


def snapshot_columns(snapshot: BlockSnapshot) -> dict[str, np.ndarray]:
    """The snapshot's per-block tuples as numpy columns of the wire dtypes."""
    n = len(snapshot.owner)
    # fromiter is the quicker way from a tuple of ints; the bool column converts quicker through asarray.
    return {
        name: np.asarray(snapshot.shared, dtype=dtype)
        if name == "shared"
        else np.fromiter(getattr(snapshot, name), dtype=dtype, count=n)
        for name, dtype in COLUMNS
    }


def pack_columns(columns: dict[str, np.ndarray], index: np.ndarray | None = None) -> bytes:
    """Concatenate the columns (restricted to ``index`` and preceded by it, for a delta) in wire order."""
    parts = []
    if index is not None:
        parts.append(index.astype("<u4").tobytes())
    for name, dtype in COLUMNS:
        col = columns[name] if index is None else columns[name][index]
        parts.append(col.astype(dtype, copy=False).tobytes())
    return b"".join(parts)


@dataclass
class BlockEncoder:
    """Encodes one grid's successive snapshots as a key frame, then deltas against what it sent last.

    A client that missed a frame (a paused stream whose last frame never arrived) gets a key frame: Race.frame
    compares the frame number the client last applied with the last one encoded.
    """

    previous: dict[str, np.ndarray] | None = field(default=None, repr=False)

    def encode(self, snapshot: BlockSnapshot, *, key: bool = False) -> dict:
        return self.encode_columns(snapshot_columns(snapshot), key=key)

    def encode_columns(self, cols: dict[str, np.ndarray], *, key: bool = False) -> dict:
        n = len(cols["owner"])
        prev = self.previous
        self.previous = cols
        if key or prev is None or len(prev["owner"]) != n:
            return {"key": True, "n": n, "data": _b64(pack_columns(cols))}
        changed = np.zeros(n, dtype=bool)
        for name, _ in COLUMNS:
            changed |= cols[name] != prev[name]
        index = np.flatnonzero(changed)
        # A delta costs 17 bytes a block against a key frame's 13: past about 3/4 changed, send everything.
        if len(index) * 17 >= n * 13:
            return {"key": True, "n": n, "data": _b64(pack_columns(cols))}
        return {"key": False, "n": len(index), "data": _b64(pack_columns(cols, index))}


def decode_blocks(blocks: dict, state: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The inverse of BlockEncoder.encode, applied to ``state`` (a key frame replaces it). For tests and tools;
    the page does the same in lab.js."""
    raw = base64.b64decode(blocks["data"])
    m = blocks["n"]
    offset = 0
    index = None
    if not blocks["key"]:
        if state is None:
            raise ValueError("a delta frame needs the state it patches")
        index = np.frombuffer(raw, dtype="<u4", count=m, offset=0)
        offset = 4 * m
    cols = {}
    for name, dtype in COLUMNS:
        col = np.frombuffer(raw, dtype=dtype, count=m, offset=offset)
        offset += col.nbytes
        cols[name] = col
    if index is None:
        return {name: col.copy() for name, col in cols.items()}
    out = {name: col.copy() for name, col in state.items()}
    for name, col in cols.items():
        out[name][index] = col
    return out


def usage_dict(usage: SlotUsage) -> dict[str, int]:
    return {
        "token": usage.token,
        "reserved": usage.reserved,
        "internal_fragmentation": usage.internal_fragmentation,
        "overhead": usage.overhead,
        "free": usage.free,
    }


def counters_dict(counters: dict, usage: SlotUsage) -> dict:
    """The counters the page shows, plus the share of memory holding tokens (token slots / all slots, %)."""
    out = {key: counters[key] for key in COUNTER_KEYS if key in counters}
    out["token_share"] = 100.0 * usage.token / usage.num_slots if usage.num_slots else 0.0
    return out


def max_unfilled_slots_per_owner(columns: dict[str, np.ndarray]) -> int:
    """The most slots any one request holds without a token in them (reserved + internal + overhead).

    With 16-token pages this is at most 15 (vLLM paper §4.3: waste is bounded by one partly filled block per
    sequence); with "reserve the max" it is most of a 2,048-token slab. The third question reads it.
    """
    owner = columns["owner"]
    held = owner >= 0
    if not held.any():
        return 0
    unfilled = (
        columns["reserved"].astype(np.int64)
        + columns["internal_fragmentation"]
        + columns["overhead"]
    )[held]
    ids = owner[held]
    if ids.max() > 16 * len(owner):
        # Sparse request ids: compact them first so that bincount stays small.
        ids = np.unique(ids, return_inverse=True)[1]
    return int(np.bincount(ids, weights=unfilled).max())


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def aggregate_columns(columns: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """Display blocks of ``k`` consecutive blocks each, for pools too large to send block by block: the states
    summed, the owner the one holding most of the group's slots, shared if any block is. The page draws them as
    blocks of ``k × block_size`` slots and says "one square = k blocks"."""
    if k <= 1:
        return columns
    n = len(columns["owner"])
    m = -(-n // k)
    pad = m * k - n

    def grouped(col: np.ndarray, fill) -> np.ndarray:
        return np.concatenate((col, np.full(pad, fill, dtype=col.dtype))).reshape(m, k)

    out = {}
    held = np.zeros((m, k), dtype=np.int64)
    for name in ("token", "reserved", "internal_fragmentation", "overhead"):
        g = grouped(columns[name], 0)
        held += g
        out[name] = g.sum(axis=1).astype("<u2")
    owner = grouped(columns["owner"], -1)
    best = np.argmax(np.where(owner >= 0, held + 1, 0), axis=1)
    out["owner"] = owner[np.arange(m), best].astype("<i4")
    out["shared"] = grouped(columns["shared"], 0).max(axis=1).astype("u1")
    return out
