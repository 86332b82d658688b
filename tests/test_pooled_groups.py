"""A hybrid model's KV cache groups against the simulator's pool (config/resolve.py: _hybrid_groups, _hybrid_notes,
_pooled_groups_notes; kvlab.memory.hybrid).

vLLM gives each request blocks in every KV cache group (a fixed state block per Mamba group, a window's worth in a
sliding one) from one pool of blocks. The paged strategies do the same (kvlab.memory.hybrid) over vLLM's blocks, and
a run says so. Where the simulator does not give blocks per group (a CPU tier, speculative decoding, ...) it still
pools vLLM's printed token figure in blocks that hold only each request's tokens, and says that it admits more
requests at once than vLLM, with vLLM's concurrency at 1,024 tokens (what `kvlab size --context-len 1024` prints).
"""

from __future__ import annotations

import json
import re

import pytest

HYBRID = "tests/data/sizing_configs/qwen3.6-27b.json"


def _workload(tmp_path, n: int = 20) -> str:
    path = tmp_path / "w.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "0,256,32\n" * n)
    return str(path)


def _group_notes(r) -> list[str]:
    """The run's notes (stderr, "note: ..." each) that speak of KV cache groups, unwrapped."""
    notes = " ".join(r.stderr.split()).split("note: ")
    return [n.strip() for n in notes if "KV cache groups" in n]


def test_a_hybrid_run_takes_blocks_in_every_group_from_vllms_pool(kvlab, tmp_path):
    r = kvlab("run", "vllm", "--model", HYBRID, "--gpu", "h100-sxm", "--workload", _workload(tmp_path), "--json")
    sized = kvlab("size", HYBRID, "--gpu", "h100-sxm", "--json").json()  # (vLLM's pool, as kvlab size works it out)
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["block_size"] == sized["block_size"] and out["num_slots"] == sized["num_blocks"] * sized["block_size"]
    notes = _group_notes(r)
    assert len(notes) == 1, notes
    assert notes[0].startswith("qwen3.6-27b keeps 4 KV cache groups (3 mamba, 1 full_attention): the paged strategies "
                               "give each request blocks in every one from vLLM's pool of "
                               f"{sized['num_blocks']:,} blocks of {sized['block_size']} tokens, as vLLM does")
    assert "prefix-cache hits are not simulated for it (every lookup misses, but for what follows)" in notes[0]
    assert ("without prefix caching every strategy holds 1 state block a request in each Mamba group; with prefix "
            "caching on (vllm: mamba_cache_mode 'align'") in notes[0]
    assert ("vLLM 0.32.0's startup arithmetic counts 2 a request (`kvlab size`'s maximum concurrency) while the paged "
            "strategies hold what vLLM holds at run time: one state block, a second for the step after a request crosses "
            "a block boundary, prefill chunks cut at block boundaries; a preempted request's own blocks still cached are "
            "its only prefix-cache hits") in notes[0]
    assert "prefill checkpoint" not in notes[0]  # (a Gated DeltaNet mixer takes none)


def test_a_set_pool_is_vllms_blocks(kvlab, tmp_path):
    sized = kvlab("size", HYBRID, "--gpu", "h100-sxm", "--json").json()
    r = kvlab("run", "vllm", "--model", HYBRID, "--gpu", "h100-sxm", "--workload", _workload(tmp_path),
              "--num-gpu-blocks", "200", "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["num_slots"] == 200 * sized["block_size"]
    assert f"pool of 200 blocks of {sized['block_size']} tokens" in _group_notes(r)[0]


def test_where_groups_are_not_served_a_run_says_vllm_holds_fewer_requests_than_its_pool(kvlab, tmp_path):
    r = kvlab("run", "vllm", "--model", HYBRID, "--gpu", "h100-sxm", "--workload", _workload(tmp_path),
              "--kv-offloading-size", "8", "--json")
    sized = kvlab("size", HYBRID, "--gpu", "h100-sxm", "--json").json()
    slots = sized["num_tokens"]
    assert r.exit_code == 0 and json.loads(r.stdout)["num_slots"] == slots
    notes = _group_notes(r)
    assert len(notes) == 1, notes
    note = notes[0]
    assert "qwen3.6-27b keeps 4 KV cache groups (3 mamba, 1 full_attention)" in note
    assert f"pool of {sized['num_blocks']:,} blocks of {sized['block_size']} tokens" in note
    assert "a CPU tier" in note and f"printed token figure, {slots:,} tokens, in blocks of 16" in note
    assert "it admits more requests at once than vLLM would" in note
    vllm, pooled = map(lambda s: int(s.replace(",", "")),
                       re.search(r"vLLM at most ([\d,]+), kvlab's pool ([\d,]+)", note).groups())
    assert pooled == slots // 1024
    size = kvlab("size", HYBRID, "--gpu", "h100-sxm", "--context-len", "1024")
    text = " ".join(size.stdout.split())
    assert f"at 1,024 tokens at most {vllm:,} requests fit" in text or f"at 1024 tokens at most {vllm:,} requests fit" in text
    assert vllm < pooled


def test_a_dense_model_says_nothing_of_groups(kvlab, tmp_path):
    dense = kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", _workload(tmp_path),
                  "--json")
    assert dense.exit_code == 0 and not _group_notes(dense)
    assert json.loads(dense.stdout)["block_size"] == 16


def test_pooled_groups_count_num_gpu_blocks_in_vllms_blocks_and_say_so(kvlab, tmp_path):
    """Where the groups are pooled (a CPU tier here), --num-gpu-blocks counts vLLM's blocks, as it is validated:
    the pool is their share of vLLM's printed token figure, and the note is there with it (trial 56b, finding 2)."""
    sized = kvlab("size", HYBRID, "--gpu", "h100-sxm", "--json").json()
    blocks = sized["num_blocks"] // 2
    r = kvlab("run", "vllm", "--model", HYBRID, "--gpu", "h100-sxm", "--workload", _workload(tmp_path),
              "--kv-offloading-size", "8", "--num-gpu-blocks", str(blocks), "--json")
    assert r.exit_code == 0, r.output
    slots = json.loads(r.stdout)["num_slots"]
    assert slots == sized["num_tokens"] * blocks // sized["num_blocks"] // 16 * 16
    notes = _group_notes(r)
    assert len(notes) == 1 and f"pool of {blocks:,} blocks (--num-gpu-blocks)" in notes[0], notes
    vllm = int(re.search(r"vLLM at most ([\d,]+)", notes[0]).group(1).replace(",", ""))
    # 1,024 tokens in blocks of 784 in the full attention group, 2 state blocks in each of the 3 Mamba ones (vLLM
    # 0.32.0's default for a hybrid: prefix caching on, mamba_cache_mode 'align')
    per_request = 2 + 3 * 2
    assert sized["block_size"] == 784 and vllm == (blocks - 1) // per_request


def test_a_hybrids_startup_refusal_counts_every_group_as_size_does(kvlab, tmp_path):
    """`kvlab run`'s "vLLM would refuse to start" note counts a max_model_len request's blocks in every KV cache group,
    as `kvlab size` does (trial 56b, finding 7: it counted the full attention group's alone)."""
    flags = ("--gpu", "h100-sxm", "--max-num-batched-tokens", "65536")
    size = kvlab("size", HYBRID, *flags)
    needs = re.search(r"request needs ([\d,]+) blocks", " ".join((size.stdout + size.stderr).split()))
    assert needs, size.stdout + size.stderr
    r = kvlab("run", "vllm", "--model", HYBRID, *flags, "--workload", _workload(tmp_path))
    text = " ".join((r.stdout + r.stderr).split())
    assert f"needs {needs.group(1)} blocks of 784 in its 4 KV cache groups" in text, text


@pytest.mark.parametrize("options", [
    dict(model=HYBRID, gpu="h100-sxm"),  # blocks per group, of a Mamba state's page
    dict(model=HYBRID, gpu="h100-sxm", kv_offloading_size=8),  # pooled
    dict(model=HYBRID, gpu="h100-sxm", kv_offloading_size=8, num_gpu_blocks=300),
    dict(model="tests/data/sizing_configs/gemma-4-e2b-it.json", gpu="t4"),  # sliding groups of larger blocks
], ids=["groups", "pooled", "pooled-blocks", "gemma-4"])
def test_a_hybrids_options_resolve_to_the_same_config(options):
    """``resolve(config.options())`` is the config for a hybrid too: its block size and --num-gpu-blocks are kept as
    given, not as derived (review 56, H2: Gemma 4 E2B's 32-token blocks re-resolved to 64, and a pooled hybrid's
    16-token block count was refused as vLLM's blocks)."""
    from kvlab.config.resolve import resolve

    config = resolve(**options)
    again = resolve(**config.options())
    assert again == config and again.key == config.key


def test_groups_of_different_block_sizes_get_blocks_each_in_their_own(kvlab, tmp_path):
    """Gemma 4 E2B's sliding groups keep blocks of 32 tokens beside the full group's 16: each group is given blocks
    in its own size (tests/test_hybrid_alloc.py has the exact ids), the pool's slots in the full group's, and the
    note says both (review 56, H1)."""
    r = kvlab("run", "vllm", "--model", "tests/data/sizing_configs/gemma-4-e2b-it.json", "--gpu", "t4",
              "--workload", _workload(tmp_path), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["block_size"] == 16
    notes = _group_notes(r)
    assert len(notes) == 1 and "blocks of 16 tokens in the full attention group (16 or 32 tokens by group" in notes[0]
    assert "does not give blocks per group" not in notes[0]
