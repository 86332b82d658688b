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
    import re

    shorter = re.search(r"Would fit: --tensor-parallel-size 8 on this GPU with --max-model-len (\d+)", err)
    assert shorter, err
    assert kvlab("size", "llama-3.1-70b", "--gpu", "l4", "-tp", 8, "--max-model-len", shorter[1]).exit_code == 0
    fit = kvlab("fit", "llama-3.1-70b", "--gpu", "l4", "--json").json()["fewest_gpus_pipelined"]
    tp, pp = fit["tensor_parallel_size"], fit["pipeline_parallel_size"]
    assert pp > 1
    assert (f"with pipeline stages too (`kvlab fit`'s fewest GPUs): --tensor-parallel-size {tp} "
            f"--pipeline-parallel-size {pp} ({tp * pp} x this GPU) at the full 131,072 tokens") in err
    assert kvlab("size", "llama-3.1-70b", "--gpu", "l4", "-tp", tp, "-pp", pp).exit_code == 0
    # (where tensor parallelism alone starts it at its full length, where stages were asked for, and where the
    # refusal is not of memory, no stages are named)
    for args in (("--gpu", "h200"), ("--gpu", "l4", "-pp", "2"), ("--gpu", "l4", "-tp", "7")):
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


def test_a_config_files_digit_groups_read_alike_in_yaml_and_toml(kvlab, tmp_path):
    """A `--config` TOML took max-num-seqs = 1_000 and the same YAML was refused: both now read TOML's digit groups
    (kvlab.validate.FILE_INT_TEXT), and both refuse what TOML refuses (a doubled underscore)."""
    setups = []
    for name, text in (("c.yaml", "max-num-seqs: 1_000\nmax-num-batched-tokens: 8_192\nrate: 1_0.5\n"),
                       ("c.toml", "max-num-seqs = 1_000\nmax-num-batched-tokens = 8_192\nrate = 1_0.5\n")):
        (tmp_path / name).write_text(text)
        r = kvlab("run", "vllm", "-n", "5", "--config", tmp_path / name, "--json")
        assert r.exit_code == 0, r.stderr
        setups.append({k: r.json()["setup"][k] for k in ("max_num_seqs", "max_num_batched_tokens")})
    assert setups[0] == setups[1] == {"max_num_seqs": 1000, "max_num_batched_tokens": 8192}
    (tmp_path / "d.yaml").write_text("max-num-seqs: 1__000\n")
    (tmp_path / "d.toml").write_text("max-num-seqs = 1__000\n")
    r = kvlab("run", "vllm", "-n", "5", "--config", tmp_path / "d.yaml")
    assert r.exit_code == 2 and "max_num_seqs '1__000' is not a whole number written in digits" in r.stderr
    r = kvlab("run", "vllm", "-n", "5", "--config", tmp_path / "d.toml")
    assert r.exit_code == 2 and "not valid TOML" in r.stderr


def test_size_and_fit_help_list_exactly_the_speculative_methods_they_take(kvlab):
    """`kvlab size --help` listed eagle and draft_model, which size refuses: its help now names the sized methods
    (kvlab.sizing.SPECULATIVE_METHODS, the set its check reads); `kvlab run --help` keeps the run's four."""
    from kvlab.config.options import SPECULATIVE_METHOD_CHOICES
    from kvlab.sizing import SPECULATIVE_METHODS

    for command in ("size", "fit"):
        text = _flat(kvlab(command, "--help").stdout)
        assert "--speculative-config method: ngram or mtp." in text, text
        assert "eagle" not in text and "draft_model" not in text
        for method in SPECULATIVE_METHOD_CHOICES:  # (those it leaves out are refused as not sized)
            r = kvlab(command, "llama-3.1-8b", "--gpu", "h100-sxm", "--speculative-method", method,
                      "--num-speculative-tokens", "2", "--json")
            assert (r.exit_code == 2 and "is not sized" in r.stderr) == (method not in SPECULATIVE_METHODS), method
        assert kvlab(command, "llama-3.1-8b", "--gpu", "h100-sxm", "--speculative-method", "ngram").exit_code == 0
    assert "method: ngram, draft_model, eagle or mtp." in _flat(kvlab("run", "--help").stdout)


def test_gpu_3050_names_the_catalogues_card_and_the_8gb_one_it_lacks(kvlab):
    """`--gpu 3050` was unknown (its suggestions led with MI300X). The RTX 3050 comes with 6 GB and 8 GB and the
    catalogue holds the 6 GB card only, so the name is ambiguous, not an alias: refused naming both, the 8 GB card
    as given by --gpu-memory-gib; `kvlab gpus` lists it; 3050-6gb still resolves."""
    for name in ("3050", "RTX 3050", "geforce-rtx-3050"):
        r = kvlab("size", "llama-3.2-1b", "--gpu", name)
        assert r.exit_code == 2 and "Traceback" not in r.stderr
        assert (f"GPU name {name!r} fits 2 cards: RTX-3050-6GB and RTX 3050 8GB (not in the catalogue: give its memory "
                "with --gpu-memory-gib); name one of them (--gpu rtx-3050-6gb)") in _flat(r.stderr)
    assert "3050: RTX-3050-6GB or RTX 3050 8GB (not in the catalogue)" in _flat(kvlab("gpus").stdout)
    assert kvlab("size", "llama-3.2-1b", "--gpu", "3050-6gb", "--json").json()["gpu_name"] == "RTX-3050-6GB"


def test_the_labs_calculator_and_kvlab_size_take_the_same_ranges(kvlab):
    """The lab took gpu_memory_utilization from 0.05 and at most 100,000 conversations, kvlab size above 0 and 2**30:
    both now read kvlab.validate.option_range, and the page is sent the same ranges (/api/catalog's "ranges")."""
    from starlette.testclient import TestClient

    from kvlab.validate import option_range
    from kvlab.web.server import create_app

    model, gpu = "llama-3.2-1b", "h100-sxm"
    cases = [("gpu_memory_utilization", "--gpu-memory-utilization", "0.04", True),
             ("gpu_memory_utilization", "--gpu-memory-utilization", "0", False),
             ("gpu_memory_utilization", "--gpu-memory-utilization", "1.01", False),
             ("concurrency", "--concurrency", str(2**30), True),
             ("concurrency", "--concurrency", str(2**30 + 1), False),
             ("concurrency", "--concurrency", "0", False),
             ("context_len", "--context-len", str(2**34 + 1), False)]
    with TestClient(create_app(allowed_hosts=["testserver"])) as client:
        ranges = client.get("/api/catalog").json()["ranges"]
        for name, flag, value, taken in cases:
            lab = client.get("/api/size", params={"model": model, "gpu": gpu, name: value})
            cli = kvlab("size", model, "--gpu", gpu, flag, value, "--json")
            refused = ("out of range" in lab.json().get("error", ""), "out of range" in cli.stderr)
            assert refused == (not taken, not taken), (name, value, lab.text, cli.stderr)
            assert (lab.status_code == 200) == (cli.exit_code == 0) and "Traceback" not in cli.stderr
    assert ranges == {name: {"lo": lo, "hi": hi, "lo_open": lo_open} for name in ranges
                      for lo, hi, lo_open in [option_range(name)]}
    assert ranges["gpu_memory_utilization"] == {"lo": 0.0, "hi": 1.0, "lo_open": True}


def test_capacity_says_how_far_along_its_search_is(kvlab, tmp_path):
    """`kvlab capacity` on long work printed only the points stored of those asked so far: each round of the search
    now says its number of about how many, the time so far and about how long the rest takes at that pace (on
    stderr, never with --json)."""
    import re

    r = kvlab("capacity", "-n", "200", "--cost", "roofline", "--out", tmp_path)
    assert r.exit_code == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("capacity search: round ")]
    assert lines and "capacity search" not in r.stdout
    pattern = (r"capacity search: round (\d+) done in [0-9hmins ]+; (about|at least) (\d+) more rounds?"
               r"( \(a search is still doubling or halving to its bracket\))?, ~[0-9hmins ]+ at this pace")
    for k, line in enumerate(lines, 1):
        match = re.fullmatch(pattern, line)
        assert match, line
        assert int(match[1]) == k
        assert (match[2] == "at least") == (match[4] is not None)
    r = kvlab("capacity", "-n", "200", "--cost", "roofline", "--out", tmp_path, "--json")
    assert r.exit_code == 0 and "capacity search" not in r.stderr + r.stdout
