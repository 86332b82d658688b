"""The notes the lab writes on its figures: free gaps, the head of the queue and what it needs, evictions."""

from __future__ import annotations

import numpy as np

from kvlab.web.annotate import Annotator, free_gaps, slab_slots
from kvlab.web.params import parse_run_spec
from kvlab.web.server import build_race


def cols(owner, token):
    n = len(owner)
    zero = np.zeros(n, dtype="<u2")
    return {"owner": np.array(owner, dtype="<i4"), "token": np.array(token, dtype="<u2"), "reserved": zero,
            "internal_fragmentation": zero, "overhead": zero, "shared": np.zeros(n, dtype="u1")}


def test_free_gaps_finds_the_largest_run():
    c = cols([-1, 3, -1, -1, -1, 4, -1, -1], [0, 16, 0, 0, 0, 5, 0, 0])
    assert free_gaps(c) == (6, 3, 2)
    assert free_gaps(cols([1, 2], [16, 16])) == (0, 0, -1)


def test_slabs_are_the_papers_baselines():
    assert slab_slots("max", 100, 30, None, 2048) == 2048
    assert slab_slots("max", 100, 30, 200, 2048) == 300
    assert slab_slots("pow2", 100, 25, None, 2048) == 132  # output 25 -> 32
    assert slab_slots("oracle", 100, 25, None, 2048) == 125


def test_reserve_the_max_says_what_the_head_of_the_queue_needs():
    race = build_race(parse_run_spec({"kind": "grid", "strategies": ["continuous+max"], "num_requests": 200}))
    race.frame(None)
    for _ in range(30):
        race.advance(1.0)
        note = race.frame(race.seq)["grids"][0]["note"]
    # A 2,048-token slab is 128 blocks of 16; 867 blocks hold six, and the seventh waits with a gap too small.
    assert note["next_blocks"] == 128 and note["gap_blocks"] < 128 and not note["next_readmit"]
    assert note["free_blocks"] >= note["gap_blocks"]


def test_evictions_are_named_between_frames():
    race = build_race(parse_run_spec({"kind": "grid", "strategies": ["continuous+paged"], "num_blocks": 64,
                                      "rate": 20, "num_requests": 200}))
    race.frame(None)
    named, counted = [], 0
    for _ in range(400):
        race.step()
        grid = race.frame(race.seq)["grids"][0]
        named += grid["note"]["evicted"]
        counted = grid["counters"]["num_preemptions"]
    # Frame by frame (one engine iteration each), every eviction the engine counts is named.
    assert counted > 0 and len(named) == counted == grid["note"]["evictions_seen"]
    requests = {r.request_id: r for r in race.sims[0].requests}
    assert all(rid in requests for rid in named)
    assert 0 < grid["note"]["recomputed_output_tokens"] <= sum(requests[rid].num_output_tokens for rid in named)


def test_an_annotator_without_evictions_names_none():
    class R:
        def __init__(self, i):
            self.request_id, self.arrival_time, self.prompt_len = i, 0.0, 10
            self.num_output_tokens, self.max_tokens = 5, None

    a = Annotator([R(0), R(1)], "paged", 16, 2048, 0.0)
    counters = {"num_preemptions": 0, "num_waiting": 1}
    first = a.note(cols([0, -1], [10, 0]), counters, 1.0)
    assert first["evicted"] == [] and first["next_id"] == 1 and first["next_blocks"] == 1
    second = a.note(cols([-1, 1], [0, 10]), {**counters, "num_waiting": 0}, 2.0)  # 0 finished, 1 admitted
    assert second["evicted"] == [] and "next_id" not in second
