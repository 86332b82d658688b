"""The frame encoding: what the page decodes must be exactly the snapshot the simulator gave."""

from __future__ import annotations

import numpy as np

from kvlab.memory.base import BlockSnapshot
from kvlab.web.frames import BlockEncoder, decode_blocks, max_unfilled_slots_per_owner, snapshot_columns


def snap(owner, token, reserved=None, internal=None, overhead=None, shared=None, block_size=16):
    n = len(owner)
    z = (0,) * n
    return BlockSnapshot(
        block_size, tuple(owner), tuple(token), tuple(reserved or z), tuple(internal or z), tuple(overhead or z),
        tuple(shared or (False,) * n),
    )


def as_lists(cols):
    return {k: v.tolist() for k, v in cols.items()}


def test_key_frame_round_trip():
    s = snap([3, 3, -1, 7], [16, 5, 0, 2], reserved=[0, 11, 0, 0], internal=[0, 0, 0, 14],
             shared=[False, True, False, False])
    msg = BlockEncoder().encode(s)
    assert msg["key"] is True and msg["n"] == 4
    # 4 blocks × (4 + 2·4 + 1) bytes, base64: 52 bytes -> 72 characters.
    assert len(msg["data"]) == 72
    assert as_lists(decode_blocks(msg)) == {
        "owner": [3, 3, -1, 7], "token": [16, 5, 0, 2], "reserved": [0, 11, 0, 0],
        "internal_fragmentation": [0, 0, 0, 14], "overhead": [0, 0, 0, 0], "shared": [0, 1, 0, 0],
    }


def test_delta_carries_only_changed_blocks_and_patches_state():
    enc = BlockEncoder()
    first = snap([1] * 8 + [-1] * 8, [16] * 7 + [3] + [0] * 8, reserved=[0] * 7 + [13] + [0] * 8)
    state = decode_blocks(enc.encode(first))
    second = snap([1] * 8 + [2] + [-1] * 7, [16] * 7 + [4] + [9] + [0] * 7, reserved=[0] * 7 + [12] + [7] + [0] * 7)
    msg = enc.encode(second)
    assert msg["key"] is False and msg["n"] == 2  # blocks 7 and 8
    index = np.frombuffer(__import__("base64").b64decode(msg["data"]), dtype="<u4", count=2)
    assert index.tolist() == [7, 8]
    assert as_lists(decode_blocks(msg, state)) == as_lists(snapshot_columns(second))


def test_unchanged_snapshot_gives_an_empty_delta():
    enc = BlockEncoder()
    s = snap([0, 1], [16, 16])
    enc.encode(s)
    msg = enc.encode(s)
    assert msg == {"key": False, "n": 0, "data": ""}


def test_mostly_changed_snapshot_is_sent_as_a_key_frame():
    enc = BlockEncoder()
    enc.encode(snap([-1] * 10, [0] * 10))
    msg = enc.encode(snap(list(range(10)), [1] * 10))
    assert msg["key"] is True


def test_forced_key_frame():
    enc = BlockEncoder()
    s = snap([0], [1])
    enc.encode(s)
    assert enc.encode(s, key=True)["key"] is True


def test_max_unfilled_slots_per_owner_sums_each_requests_blocks():
    # Request 5 holds two blocks: 3 reserved + 10 internal; request 9 one block with 15 reserved.
    s = snap([5, 5, 9, -1], [13, 3, 1, 0], reserved=[3, 0, 15, 0], internal=[0, 10, 0, 0])
    assert max_unfilled_slots_per_owner(snapshot_columns(s)) == 15
    s = snap([5, 5, 9, -1], [13, 3, 1, 0], reserved=[3, 0, 15, 0], internal=[0, 13, 0, 0])
    assert max_unfilled_slots_per_owner(snapshot_columns(s)) == 16
    assert max_unfilled_slots_per_owner(snapshot_columns(snap([-1, -1], [0, 0]))) == 0
