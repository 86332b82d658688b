"""The slab strategies (max, pow2, oracle) on a hybrid model: one slab per request covering every KV cache group
(kvlab.memory.contiguous.group_slots), in the same pool as the paged hybrid run.

A slab holds the policy's token reservation R in each full attention group, each Mamba group's state blocks and each
sliding group's window (at most R); the first full attention group's R slots hold the tokens, the rest is overhead.
"""

from __future__ import annotations

import csv
import json

import pytest
from seqs import Seq

from kvlab.errors import KvlabError
from kvlab.memory import ContiguousAllocator, Fit, make_allocator, slot_usage
from kvlab.memory.base import Admission
from kvlab.memory.buddy import next_pow2
from kvlab.memory.contiguous import group_slots
from kvlab.memory.hybrid import GroupSpec
from kvlab.workload.request import Request

HYBRID = "tests/data/sizing_configs/qwen3.6-27b.json"
BS = 16
FULL, MAMBA2, SLIDING = ("full_attention", 1, 0, 0), ("mamba", 2, 0, 0), ("sliding_attention", 1, 32, 3)



def _slabs(policy: str, groups, num_slots: int = 1024) -> ContiguousAllocator:
    return make_allocator(policy, num_slots=num_slots, block_size=BS, max_model_len=512, kv_cache_groups=groups)


@pytest.mark.parametrize(
    ("groups", "prompt", "output", "extra"),
    [
        # R = 124; Mamba 2 blocks of 16 = 32; the sliding group's 3 admission blocks of 16 = 48 (< R)
        ((MAMBA2, FULL, SLIDING), 100, 25, 32 + 48),
        # R = 24 < the window's 48 slots: the sliding group holds R
        ((FULL, MAMBA2, SLIDING), 20, 5, 32 + 24),
        # a second full attention group holds R again
        ((FULL, FULL), 100, 25, 124),
        # a sliding group without an admission cap: its window in tokens (32)
        ((FULL, ("sliding_attention", 1, 32, 0)), 100, 25, 32),
    ],
)
def test_a_hybrid_slab_reserves_every_group(groups, prompt, output, extra):
    allocator = _slabs("oracle", groups)
    request = Request(0, 0.0, prompt, output)
    reserved = request.num_kv_tokens
    assert allocator.slab_size(request) == reserved
    assert group_slots(tuple(GroupSpec(*g) for g in groups), reserved, BS) == extra
    whole = reserved + extra
    seq = Seq(request)
    assert allocator.admission(seq) == Admission(whole, next_pow2(whole), 1024, True)
    assert allocator.allocate_slots(seq, prompt) is Fit.NOW
    slab = allocator.get_slab(0)
    assert (slab.num_slots, slab.group_slots, slab.chunk_size) == (reserved, extra, next_pow2(whole))
    assert allocator.get_num_slots(0) == whole
    seq.num_computed_tokens = prompt
    usage = slot_usage(allocator, prompt)
    # the tokens' part as a single-group slab's; the other groups' slots and the round-up are overhead
    assert (usage.token, usage.reserved, usage.internal_fragmentation) == (prompt, reserved - prompt, 0)
    assert usage.overhead == next_pow2(whole) - reserved
    assert usage.free == 1024 - next_pow2(whole)
    allocator.check_invariants([seq])
    allocator.free(seq)
    assert slot_usage(allocator, 0).free == 1024
    allocator.check_invariants([])


def test_a_tiny_pool_fits_as_many_slabs_as_the_whole_slabs_allow():
    # pow2: R = 100 + 32 = 132, + Mamba 32 + sliding 48 = 212 -> chunks of 256: 4 in 1,024 slots (a token-only slab
    # of 132 would take a 256 chunk too; oracle's 124 -> 204 -> 256, alone it would take 128: 8)
    for policy, groups, fits in [("pow2", (FULL, MAMBA2, SLIDING), 4), ("oracle", (FULL, MAMBA2, SLIDING), 4),
                                 ("oracle", (FULL,), 8), ("oracle", (), 8)]:
        allocator = _slabs(policy, groups)
        seqs = [Seq(Request(i, 0.0, 100, 25)) for i in range(10)]
        placed = [s for s in seqs if allocator.allocate_slots(s, 100) is Fit.NOW]
        assert len(placed) == fits, (policy, groups)
        allocator.check_invariants(placed)


def test_a_single_group_slab_is_the_token_slab():
    one = _slabs("pow2", (FULL,))
    none = ContiguousAllocator(1024, "pow2", 512, display_block_size=BS)
    request = Request(0, 0.0, 100, 25)
    assert one.groups == () and one.admission(Seq(request)) == none.admission(Seq(request))
    assert one.whole_slab_size(request) == one.slab_size(request) == 132


def test_a_max_slab_with_its_groups_larger_than_the_space_never_fits():
    allocator = _slabs("max", (FULL, MAMBA2), num_slots=600)  # 512 + 32 > the largest region, 512
    reason = allocator.why_never_fits(Request(0, 0.0, 100, 25))
    assert reason is not None and "other KV cache groups" in reason and "512 slots" in reason
    assert _slabs("max", (FULL,), num_slots=600).why_never_fits(Request(0, 0.0, 100, 25)) is None


def test_groups_without_full_attention_are_refused():
    with pytest.raises(KvlabError, match="full attention"):
        _slabs("oracle", (MAMBA2, SLIDING))


def _peak_running(path) -> int:
    with open(path, newline="") as f:
        return max(int(row["num_running"]) for row in csv.DictReader(f))


def test_on_a_hybrid_the_slab_strategies_batch_no_more_than_vllm(kvlab, tmp_path):
    """trial56b finding 1: orca-pow2 batched 229 requests of 1,024 tokens where vLLM holds 69 (71 since). The slabs
    hold no prefix cache; vllm+noprefix holds what `kvlab size --no-enable-prefix-caching` says fits; vllm (prefix
    caching on: vLLM 0.32.0's 'align' mode, which holds one state block a Mamba group between block boundaries) one
    more: prompts cut at the 784-token boundary, a request whose first chunk is computed holds 4 blocks, not 5, and
    the newest are preempted once prompts need their second block (tests/test_hybrid_align.py, a tiny pool)."""
    workload = tmp_path / "w.csv"
    workload.write_text("arrival_time,prompt_len,output_len\n" + "0,960,64\n" * 120)
    flags = ("--gpu", "h100-sxm", "--context-len", "1024", "--json")
    sized = kvlab("size", HYBRID, *flags, "--no-enable-prefix-caching").json()
    cap, bs = sized["workload"]["max_num_requests"], sized["block_size"]
    state_slots = (sized["workload"]["blocks_per_request"] - -(-1024 // bs)) * bs  # the Mamba groups' state blocks
    out = tmp_path / "race"
    r = kvlab("race", "orca-pow2", "orca-oracle", "vllm+noprefix", "vllm", "--model", HYBRID, "--gpu", "h100-sxm",
              "--workload", str(workload), "--out", str(out), "--no-plots")
    assert r.exit_code == 0, r.stderr
    assert _peak_running(out / "vllm-noprefix_iterations.csv") == cap
    assert (cap, _peak_running(out / "vllm_iterations.csv")) == (71, 72)
    assert "Preemptions: vllm 5 " in " ".join(r.stdout.split())
    # the slabs hold 1,024 token slots (pow2: 960 + 64; oracle 1,023) + the states, in buddy chunks of the next power of two
    slabs = (sized["num_blocks"] * bs) // next_pow2(1024 + state_slots)
    for name in ("orca-pow2", "orca-oracle"):
        assert _peak_running(out / f"{name}_iterations.csv") == slabs <= cap, name


def test_a_hybrid_race_says_its_overhead_is_not_free_and_prefix_caching_not_simulated(kvlab, tmp_path):
    """trial56b findings 3 and 6: the legend called a hybrid's Mamba states free memory; the header said "prefix
    caching on" where every lookup misses."""
    workload = tmp_path / "w.csv"
    workload.write_text("arrival_time,prompt_len,output_len\n" + "0,256,32\n" * 10)
    out = tmp_path / "race"
    r = kvlab("race", "orca-oracle", "vllm", "--model", HYBRID, "--gpu", "h100-sxm", "--workload", str(workload),
              "--wide", "--out", str(out), "--no-plots")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert ("prefix caching on for vllm (for this hybrid model only a preempted request's own blocks still cached hit, "
            "as in vLLM's 'align' mode; every other lookup misses), off for orca-oracle") in text
    assert "for paged memory this is free memory, not fragmentation" not in text
    assert "the other KV cache groups' blocks (Mamba states, sliding windows" in text and "not free" in text
    summary = json.loads((out / "summary.json").read_text())
    assert "Mamba states" in summary["memory_shares_note"]
    vllm = next(s for s in summary["strategies"] if s["name"] == "vllm")
    detailed = vllm["memory_shares_detailed"]
    assert detailed["overhead"] > 0  # (the states the note speaks of)
    assert vllm["memory_shares"]["external_fragmentation"] == pytest.approx(detailed["overhead"] + detailed["free"])


def test_a_dense_race_keeps_its_labels(kvlab, tmp_path):
    workload = tmp_path / "w.csv"
    workload.write_text("arrival_time,prompt_len,output_len\n" + "0,256,32\n" * 10)
    r = kvlab("race", "orca-oracle", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", str(workload),
              "--wide", "--json")
    assert r.exit_code == 0, r.stderr
    assert "memory_shares_note" not in json.loads(r.stdout)
    r = kvlab("race", "orca-oracle", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", str(workload),
              "--wide")
    text = " ".join(r.stdout.split())
    assert "prefix caching on for vllm, off for orca-oracle" in text and "not simulated" not in text
    assert "for paged memory this is free memory, not fragmentation" in text


def test_capacity_setup_says_prefix_caching_is_not_simulated_on_a_hybrid():
    from kvlab.config.resolve import engine_setup, resolve
    from kvlab.report.setup import setup_lines
    from kvlab.service.engine import strategies

    for model, simulated in ((HYBRID, False), ("llama-3.1-8b", True)):
        config = resolve(model=model, gpu="h100-sxm")
        setup = {**config.describe(), **engine_setup(config, strategies(["vllm"], config))}
        line = "; ".join(setup_lines(setup))
        assert ("prefix caching on (for this hybrid model only a preempted request's own blocks" in line) is not simulated, line
        assert "prefix caching on" in line
