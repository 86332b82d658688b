"""`kvlab size`: the findings of trial 47 (a new user's run), each with the exact line it now prints."""

from __future__ import annotations


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_tensor_parallel_sizes_follow_vllms_kv_head_and_mlp_rules(kvlab):
    from kvlab.catalog import get_model
    from kvlab.sizing import tensor_parallel_refusal, valid_tensor_parallel_sizes

    qwen = get_model("qwen2.5-0.5b-instruct")  # 14 heads, 2 KV heads, intermediate_size 4864
    assert valid_tensor_parallel_sizes(qwen) == [1, 2]
    assert "2 KV heads" in tensor_parallel_refusal(qwen, 7)
    assert "intermediate_size 4864" in tensor_parallel_refusal(qwen, 14)  # 14 replicates the 2 KV heads, 4864/14 no
    assert valid_tensor_parallel_sizes(get_model("opt-13b")) == [1, 2, 4, 5, 8, 10, 20, 40]
    r = kvlab("size", "qwen2.5-0.5b-instruct", "--gpu", "t4", "-tp", "7")
    assert r.exit_code == 2
    assert _one_line(r.stderr) == (
        "error: the 2 KV heads of qwen2.5-0.5b-instruct can be neither split nor replicated evenly over tensor "
        "parallel size (7): vLLM needs 7 to divide 2 or be a multiple of it; valid --tensor-parallel-size: 1, 2")
    assert kvlab("size", "qwen2.5-0.5b-instruct", "--gpu", "t4", "-tp", "2").exit_code == 0


def test_quantization_none_and_auto_mean_no_quantization(kvlab):
    plain = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "--json").json()
    assert plain["num_blocks"] == 1961 and plain["quantization"] is None
    for spelling in ("none", "None", "auto"):
        r = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "-q", spelling, "--json")
        assert r.exit_code == 0, r.stderr
        assert r.json()["num_blocks"] == 1961 and r.json()["quantization"] is None
    bad = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "-q", "foo")
    assert bad.exit_code == 2 and "or none (no --quantization: the checkpoint's own format" in _one_line(bad.stderr)
