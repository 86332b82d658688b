"""The notes the lab writes on its figures come from the engine's own objects: the head of the queue is the
scheduler's, what it needs is what the allocator then hands out, the evicted are the scheduler's outputs'."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab import service
from kvlab.config import resolve
from kvlab.web.annotate import free_mask, free_piece
from kvlab.web.frames import snapshot_columns
from kvlab.web.params import parse_run_spec
from kvlab.web.server import build_race
from kvlab.web.session import Race
from kvlab.workload import Request, Workload, load_workload

STRATEGIES = ["continuous+max", "continuous+pow2", "continuous+oracle", "continuous+paged"]


def boundary_requests(max_model_len: int) -> list[Request]:
    """Requests at the edges of every slab policy: a slab (prompt + answer - 1, the KV the oracle writes) exactly
    a power of two and one past it; answers of exactly 2^k and 2^k + 1 (pow2's round-up); a client's cap below
    and above the true answer; a prompt that leaves less room than the answer (capped at max_model_len)."""
    out = []
    for k in (5, 7, 8, 9, 10):
        p = 1 << k
        out += [(p // 2, p // 2 + 1, None), (p // 2, p // 2 + 2, None), (37, p, None), (37, p + 1, None),
                (p - 1, 1, None), (p, 1, None)]
    out += [(100, 300, 50), (100, 30, 500), (300, 400, 300), (1500, 900, None), (max_model_len - 2, 5, None)]
    sampled = load_workload("paper-sharegpt", num_requests=24, rate=50.0, seed=7).requests
    out += [(r.prompt_len, r.output_len, r.max_tokens) for r in sampled]
    # All arrive at once, so that each spends a while at the head of the queue.
    return [Request(i, 0.001 * i, p, o, m) for i, (p, o, m) in enumerate(out)]


@pytest.mark.parametrize("name", STRATEGIES)
def test_what_the_lab_says_the_head_of_the_queue_needs_is_what_the_allocator_hands_out(name):
    """Step by step: whenever the lab names the head of the queue and what admitting it takes, the next time that
    request is admitted the allocator hands out exactly that (a slab's buddy chunk, or its first blocks), and the
    note said it waits for memory exactly when it did not fit."""
    config = resolve(model="opt-13b", gpu="a100-40gb", num_gpu_blocks=300)
    requests = boundary_requests(config.scheduler.max_model_len)
    workload = Workload("boundaries", tuple(requests), "boundary requests", "tests")
    _, (sim,) = service.start(config, service.strategies([name], config), workload=workload, max_iterations=1)
    race = Race([sim])
    bs = config.cache.block_size
    said: dict[int, dict] = {}
    checked = boundary = 0
    while not race.done:
        race.step()
        frame = race.frame(race.seq)
        head = frame["grids"][0]["note"].get("head")
        # The head named is the scheduler's own, and the note's numbers are the allocator's for it.
        if head is not None:
            seq = sim.scheduler.waiting[0]
            assert head["id"] == seq.request_id and head["num_tokens"] == seq.num_tokens
            said[head["id"]] = head
        for rid in list(said):
            held = sim.allocator.get_num_slots(rid)
            if held and sim.seqs[rid].num_computed_tokens <= said[rid]["num_tokens"]:
                h = said.pop(rid)
                if name.endswith("paged"):
                    assert len(sim.allocator.get_block_ids(rid)) * bs == h["slots"], (rid, h)
                    assert h["asked_slots"] == h["num_tokens"] and not h["one_piece"]
                else:
                    slab = sim.allocator.get_slab(rid)
                    assert (slab.num_slots, slab.chunk_size) == (h["asked_slots"], h["slots"]), (rid, h)
                    assert slab.num_slots == sim.allocator.slab_size(sim.seqs[rid].request) and h["one_piece"]
                    r = sim.seqs[rid].request
                    boundary += (r.num_kv_tokens & (r.num_kv_tokens - 1)) == 0
                checked += 1
        if head is not None and head["waits"] != "memory":
            assert head["slots"] <= head["room_slots"]
    assert checked >= 20, checked  # (small slabs are often admitted the moment they arrive, never waiting)
    if name.endswith("oracle"):
        assert boundary > 0  # slabs of exactly a power of two were among those checked


def test_evicted_ids_are_the_schedulers():
    """Every id the lab flashes as evicted is one the scheduler's outputs name, in order, frame after frame, and
    the evictions it names add up to the engine's counter."""
    race = build_race(parse_run_spec({"kind": "grid", "strategies": ["continuous+paged"], "num_blocks": 64,
                                      "rate": 20, "num_requests": 200}))
    sim = race.sims[0]
    race.frame(None)
    named, from_engine = [], []
    original = sim.run_until

    def run_until(t):
        outputs = original(t)
        from_engine.extend(i for out in outputs for i in out.preempted_req_ids)
        return outputs

    sim.run_until = run_until
    for _ in range(300):
        race.advance(0.05)
        grid = race.frame(race.seq)["grids"][0]
        named += grid["note"]["evicted"]
        if race.done:
            break
    assert named and named == from_engine
    assert len(named) == grid["counters"]["num_preemptions"] == sim.scheduler.num_preemptions
    # What they cost: the tokens dropped and waiting to be computed again are the queue's own.
    assert grid["note"]["tokens_to_recompute"] == sum(s.num_lost_tokens for s in sim.scheduler.waiting)


def test_reserve_the_max_says_the_head_of_the_queue_waits_for_one_piece():
    race = build_race(parse_run_spec({"kind": "grid", "strategies": ["continuous+max"], "num_requests": 200}))
    race.frame(None)
    race.seek(30.0)
    note = race.frame(race.seq)["grids"][0]["note"]
    head = note["head"]
    # A 2,048-token slab is a 2,048-slot chunk (128 blocks of 16); the largest free chunk is smaller: it waits,
    # though blocks are free, and the outlined piece is that free chunk.
    assert head["slots"] == head["asked_slots"] == 2048 and head["one_piece"] and head["waits"] == "memory"
    assert head["room_slots"] < 2048 and note["free_blocks"] * 16 >= head["room_slots"]
    start, size = note["piece"]
    assert size * 16 == head["room_slots"] and start % size == 0
    cols = snapshot_columns(race.sims[0].snapshot())
    assert free_mask(cols)[start:start + size].all()


def test_free_piece_is_the_lowest_aligned_run():
    free = np.array([0, 1, 1, 0, 1, 1, 1, 1, 1, 1], dtype=bool)
    assert free_piece(free, 2) == 4  # [1, 2] is free but starts at an odd block
    assert free_piece(free, 4) == 4
    assert free_piece(free, 8) == -1


def test_a_followed_conversation_carries_its_block_table():
    race = build_race(parse_run_spec({"kind": "race", "strategies": ["continuous+max", "continuous+paged"],
                                      "num_requests": 60}))
    race.frame(None)
    race.seek(8.0)
    rid = race.sims[1].scheduler.running[0].request_id
    race.follow = rid
    frame = race.frame(race.seq)
    slab, pages = (g["table"] for g in frame["grids"])
    assert pages["blocks"] == race.sims[1].allocator.get_block_ids(rid)
    assert len(pages["blocks"]) == -(-race.sims[1].allocator.get_num_slots(rid) // 16)
    if slab["blocks"]:  # under reserve-the-max the same conversation may still wait
        s = race.sims[0].allocator.get_slab(rid)
        assert slab["blocks"] == list(range(s.address // 16, -(-(s.address + s.num_slots) // 16)))
