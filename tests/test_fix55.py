"""Fix 55: user-facing leftovers found by fresh-clone trials, each through the CLI."""

from __future__ import annotations


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_size_refusal_names_kvlab_fits_fewest_pipeline_stages(kvlab):
    """llama-3.1-70b on L4: tensor parallelism alone starts only at a shorter max_model_len; the refusal also names
    `kvlab fit`'s fewest GPUs with pipeline stages (searched once in the CLI face, not in sizing.raise_too_small)."""
    r = kvlab("size", "llama-3.1-70b", "--gpu", "l4")
    err = _flat(r.stderr)
    assert r.exit_code == 2, err
    assert "Would fit: --tensor-parallel-size 8 on this GPU with --max-model-len 58272" in err
    fit = kvlab("fit", "llama-3.1-70b", "--gpu", "l4", "--json").json()["fewest_gpus_pipelined"]
    tp, pp = fit["tensor_parallel_size"], fit["pipeline_parallel_size"]
    assert pp > 1
    assert (f"with pipeline stages too (`kvlab fit`'s fewest GPUs): --tensor-parallel-size {tp} "
            f"--pipeline-parallel-size {pp} ({tp * pp} x this GPU) at the full 131,072 tokens") in err
    assert kvlab("size", "llama-3.1-70b", "--gpu", "l4", "-tp", tp, "-pp", pp).exit_code == 0
    # (where tensor parallelism alone is the fewest, or stages were asked for, no stages are named)
    for args in (("--gpu", "h200"), ("--gpu", "l4", "-pp", "2")):
        r = kvlab("size", "llama-3.1-70b", *args)
        assert r.exit_code == 2 and "pipeline stages too" not in r.stderr, r.stderr


def test_lab_too_small_refusal_searches_no_stages():
    """The lab's path (kvlab.sizing.raise_too_small) stays without the search: its refusal names no stages."""
    import pytest

    from kvlab.catalog import get_model
    from kvlab.errors import KvlabError
    from kvlab.service.size import default_sizing_options, sizing_config
    from kvlab.sizing import size_kv_cache

    _, config = sizing_config(**default_sizing_options(gpu="l4"))
    with pytest.raises(KvlabError) as refusal:
        size_kv_cache(get_model("llama-3.1-70b"), config)
    assert "Would fit" in str(refusal.value) and "--pipeline-parallel-size" not in str(refusal.value)
