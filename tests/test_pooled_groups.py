"""A hybrid model's KV cache groups against the simulator's one pool (config/resolve.py: _pooled_groups_notes).

vLLM gives each request blocks in every KV cache group (a fixed state block per Mamba group, a window's worth in a
sliding one); the simulator pools vLLM's printed token figure in blocks that hold only each request's tokens. A run
says so, with vLLM's concurrency at 1,024 tokens (what `kvlab size --context-len 1024` prints) beside the pool's.
"""

from __future__ import annotations

import json
import re

HYBRID = "tests/data/sizing_configs/qwen3.6-27b.json"


def _workload(tmp_path, n: int = 20) -> str:
    path = tmp_path / "w.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "0,256,32\n" * n)
    return str(path)


def _group_notes(r) -> list[str]:
    """The run's notes (stderr, "note: ..." each) that speak of KV cache groups, unwrapped."""
    notes = " ".join(r.stderr.split()).split("note: ")
    return [n.strip() for n in notes if "KV cache groups" in n]


def test_a_hybrid_run_says_vllm_holds_fewer_requests_than_its_pool(kvlab, tmp_path):
    r = kvlab("run", "vllm", "--model", HYBRID, "--gpu", "h100-sxm", "--workload", _workload(tmp_path), "--json")
    sized = kvlab("size", HYBRID, "--gpu", "h100-sxm", "--json").json()  # (vLLM's pool, as kvlab size works it out)
    slots = sized["num_tokens"]
    assert r.exit_code == 0 and json.loads(r.stdout)["num_slots"] == slots
    notes = _group_notes(r)
    assert len(notes) == 1, notes
    note = notes[0]
    assert "qwen3.6-27b keeps 4 KV cache groups (3 mamba, 1 full_attention)" in note
    assert f"pool of {sized['num_blocks']:,} blocks of {sized['block_size']} tokens" in note
    assert f"printed {slots:,} tokens in blocks of 16" in note
    vllm, pooled = map(lambda s: int(s.replace(",", "")),
                       re.search(r"vLLM at most ([\d,]+), kvlab's pool ([\d,]+)", note).groups())
    assert pooled == slots // 1024
    size = kvlab("size", HYBRID, "--gpu", "h100-sxm", "--context-len", "1024")
    text = " ".join(size.stdout.split())
    assert f"at 1,024 tokens at most {vllm:,} requests fit" in text or f"at 1024 tokens at most {vllm:,} requests fit" in text
    assert vllm < pooled


def test_a_set_pool_or_a_dense_model_says_nothing_of_groups(kvlab, tmp_path):
    workload = _workload(tmp_path)
    given = kvlab("run", "vllm", "--model", HYBRID, "--gpu", "h100-sxm", "--workload", workload,
                  "--num-gpu-blocks", "500", "--json")
    dense = kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", workload, "--json")
    for r in (given, dense):
        assert r.exit_code == 0 and not _group_notes(r)
