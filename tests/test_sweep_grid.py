"""kvlab sweep's grids and checks: points from comma lists and grid files, and every bad input refused (one
line, exit code 2) before anything runs or is written."""

from __future__ import annotations

import re
import socket

import pytest

from kvlab.errors import KvlabError
from kvlab.sweep.capacity import Search, parse_slo
from kvlab.sweep.grid import expand, parse_cli_args, read_grid_file, run_options
from kvlab.sweep.point import resolve_point


def test_the_sweepable_options_are_kvlab_runs():
    options = run_options()
    assert {"strategy", "rate", "seed", "block_size", "max_num_seqs", "workload", "model", "gpu",
            "enable_chunked_prefill", "num_requests"} <= set(options)
    assert "as_json" not in options and "out" not in options  # how `kvlab run` reports, not what it simulates
    assert options["block_size"].flag == "--block-size" and options["block_size"].kind == "int"


def test_comma_lists_make_the_cross_product_with_defaults_filled_in():
    points = expand(parse_cli_args(["--strategy", "vllm,orca-oracle", "--rate=1,2", "-n", "300",
                                    "--no-enable-chunked-prefill"]))
    assert [(p["strategy"], p["rate"]) for p in points] == [("vllm", 1.0), ("vllm", 2.0), ("orca-oracle", 1.0),
                                                            ("orca-oracle", 2.0)]
    for p in points:
        assert p["num_requests"] == 300 and p["enable_chunked_prefill"] is False
        assert p["block_size"] == 16 and p["model"] == "opt-13b"  # `kvlab run`'s defaults
        assert set(p) == set(run_options())


def test_a_point_is_the_same_point_however_it_is_spelled(tmp_path):
    yaml_file = tmp_path / "grid.yaml"
    yaml_file.write_text("strategy: vllm\nrate: [1.0]\nnum-requests: 300\n")
    toml_file = tmp_path / "grid.toml"
    toml_file.write_text('strategy = "vllm"\nrate = 1\nnum_requests = 300\n')
    from_cli = expand(parse_cli_args(["--rate", "1", "--num-requests", "300"]))
    keys = {resolve_point(expand(*read_grid_file(f))[0], "0.1.0").key for f in (yaml_file, toml_file)}
    assert keys == {resolve_point(from_cli[0], "0.1.0").key}
    assert resolve_point(from_cli[0], "0.2.0").key not in keys  # another kvlab version: another point


@pytest.mark.parametrize("spelling", [["--cost", "roofline"], ["--max-model-len", "2048"], ["--model", "OPT-13B"],
                                      ["--gpu", "A100-40GB"], ["--arrival", "poisson"], ["--strategy", "VLLM"]])
def test_spellings_that_resolve_alike_are_one_point(spelling):
    """A point is what it resolves to: an option given at its default value, or a name spelt another way, is the
    same configuration (issue 20: four spellings had left four rows)."""
    plain = resolve_point(expand(parse_cli_args(["-n", "200"]))[0], "0.1.0")
    spelt = resolve_point(expand(parse_cli_args(["-n", "200", *spelling]))[0], "0.1.0")
    assert spelt.key == plain.key and spelt.row == plain.row
    other = resolve_point(expand(parse_cli_args(["-n", "200", "--seed", "1"]))[0], "0.1.0")
    assert other.key != plain.key


def test_a_stored_point_holds_resolved_values_never_null_for_a_default():
    row = resolve_point(expand(parse_cli_args(["-n", "200"]))[0], "0.1.0").row
    for name in ("cost", "max_model_len", "max_num_batched_tokens", "max_num_seqs", "tensor_parallel_size",
                 "num_gpu_blocks", "available_kv_gib", "gpu_memory_gib"):
        assert row[name] is not None, name
    assert (row["cost"], row["max_model_len"], row["tensor_parallel_size"]) == ("roofline", 2048, 1)
    assert row["num_gpu_blocks"] == 864 and row["num_slots"] == 864 * 16  # as tests/test_config.py's pool


def test_a_grid_file_combines_its_lists_with_explicit_points(tmp_path):
    f = tmp_path / "grid.yaml"
    f.write_text("strategy: [vllm, orca-max]\nrate: 2\npoints:\n  - {model: opt-13b, gpu: a100-40gb}\n"
                 "  - {model: opt-66b, gpu: a100-80gb, tensor_parallel_size: 4}\n")
    points = expand(*read_grid_file(f))
    assert [(p["strategy"], p["model"], p["tensor_parallel_size"]) for p in points] == [
        ("vllm", "opt-13b", None), ("vllm", "opt-66b", 4), ("orca-max", "opt-13b", None), ("orca-max", "opt-66b", 4)]


@pytest.mark.parametrize("args, message", [
    (["--block-sise", "16,32"], "did you mean --block-size?"),
    (["--rate", "1,fast"], "--rate 'fast': not a number"),
    (["--block-size", "16.5"], "--block-size '16.5': not a whole number"),
    (["--rate", "1,,2"], "an empty value in the list"),
    (["--rate", "1,1.0"], "--rate 1,1.0: '1.0' is the same value as '1', given twice; valid: each value once"),  # trial 56
    (["--strategy", "vllm,vlm"], "vlm"),
    (["--workload", "sharegtp"], "unknown workload 'sharegtp'"),
    (["--block-size", "32", "--max-model-len", "16"], "a block must fit in a sequence"),
    (["--max-num-seqs", "0"], "--max-num-seqs 0 is out of range; valid: requests per step"),  # as `kvlab run` says
    (["--seed", "0,-1"], "--seed -1 is out of range"),
    (["--cost", "paper-2042"], "unknown cost profile 'paper-2042'"),
])
def test_bad_options_and_values_are_refused_before_anything_runs(kvlab, tmp_path, args, message):
    out = tmp_path / "sweep"
    r = kvlab("sweep", *args, "-n", "20", "--workers", "1", "--out", out)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "error:" in r.stderr and message in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()  # nothing left behind


def test_an_empty_grid_is_refused(kvlab, tmp_path):
    f = tmp_path / "grid.yaml"
    f.write_text("strategy: vllm\nrate: []\n")
    r = kvlab("sweep", "--grid", f, "--out", tmp_path / "sweep")
    assert r.exit_code == 2 and "empty" in r.stderr
    f.write_text("strategy: vllm\npoints: []\n")
    r = kvlab("sweep", "--grid", f, "--out", tmp_path / "sweep")
    assert r.exit_code == 2 and "empty" in r.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("command", [("sweep", "-n", "20"), ("capacity",), ("run", "-n", "10", "--config")])
def test_a_folder_given_for_a_file_is_called_a_folder(kvlab, tmp_path, command):
    folder = tmp_path / "empty"
    folder.mkdir()
    flag = () if command[0] == "run" else ("--grid",)
    r = kvlab(*command, *flag, folder, "--out", tmp_path / "out")
    assert r.exit_code == 2 and "is a folder; valid: a .yaml, .yml or .toml" in r.stderr, r.stderr
    assert "no such file" not in r.stderr and r.stderr.count("\n") == 1
    r = kvlab("run", "-n", "10", "--cost", folder)  # (it said: does not exist)
    assert r.exit_code == 2 and f"cost profile file {folder} is a folder; valid: a .toml or .json" in r.stderr


def test_a_grid_too_large_for_the_stated_time_asks_for_yes(kvlab, tmp_path):
    out = tmp_path / "sweep"
    r = kvlab("sweep", "--rate", ",".join(str(r) for r in range(1, 41)), "--seed", "0,1,2,3,4", "-n", "2000",
              "--workers", "2", "--max-time", "5s", "--out", out)
    assert r.exit_code == 2
    assert "200 of 200 points" in r.stderr and "--yes" in r.stderr and "on 2 workers" in r.stderr
    assert not out.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_is_refused_at_once(kvlab, tmp_path, monkeypatch):
    r = kvlab("sweep", "-n", "20", "--ray-address", f"127.0.0.1:{_free_port()}", "--out", tmp_path / "s")
    assert r.exit_code == 2 and "cannot reach a Ray cluster at 127.0.0.1:" in r.stderr
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    r = kvlab("sweep", "-n", "20", "--ray-address", "auto", "--out", tmp_path / "s")
    assert r.exit_code == 2 and "RAY_ADDRESS" in r.stderr
    assert not (tmp_path / "s").exists()


def test_ray_not_installed_is_said_plainly(kvlab, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    r = kvlab("sweep", "-n", "20", "--ray", "--out", tmp_path / "s")
    assert r.exit_code == 2 and "Ray, which is not installed: pip install ray" in r.stderr


@pytest.mark.parametrize("text, metric, stat, limit", [
    ("p99_ttft<2s", "ttft_s", "p99", 2.0),
    ("p90_tpot<100ms", "tpot_s", "p90", 0.1),
    ("mean_normalized_latency<=0.1s", "normalized_latency_s_per_token", "mean", 0.1),
    ("p50_e2e<30s", "e2e_latency_s", "p50", 30.0),
])
def test_slo_parsing(text, metric, stat, limit):
    (term,) = parse_slo(text).terms
    assert (term.metric, term.stat) == (metric, stat) and term.limit_s == pytest.approx(limit)


@pytest.mark.parametrize("text", ["p100_ttft<2s", "p99_ttfb<2s", "p99_ttft<2", "p99_ttft>2s", "p99_ttft<0s"])
def test_bad_slos_are_refused(text):
    with pytest.raises(KvlabError, match="--slo"):
        parse_slo(text)


@pytest.mark.parametrize("capacity, start", [(3.3, 1.0), (0.37, 1.0), (47.0, 10.0), (1.0, 1.0)])
def test_search_brackets_then_bisects_to_the_tolerance(capacity, start):
    search = Search(start_rate=start, rtol=0.02)
    while (rate := search.next_rate()) is not None:
        search.record(rate, rate, rate <= capacity)  # latency rises with the rate; holds up to the capacity
    lo, hi = search.lo, search.hi
    assert lo <= capacity < hi and hi / lo - 1 <= 0.02
    assert search.capacity == lo
    assert len(search.probes) <= 14
    assert len({r for r, _, _ in search.probes}) == len(search.probes)  # never the same rate twice


def test_search_says_when_no_rate_holds():
    search = Search(start_rate=1.0, min_rate=0.01)
    while (rate := search.next_rate()) is not None:
        search.record(rate, None, False)
    assert search.capacity == 0.0 and search.lo is None and search.hi < 0.02


def test_a_default_stated_keeps_the_default_points_key():
    """trial 46, finding 4: stating a default (the newest vLLM's rules, recompute, fcfs) is the default point, under
    the key default points have always had (the options and the derived numbers, hashed with the cost's constants
    and the files' digests), so that stores written before keep their rows."""
    import hashlib
    import json

    from kvlab.config import resolve
    from kvlab.vllm_rules import NEWEST_KNOWN

    plain = resolve()
    old = {**plain.options(), "num_slots": plain.cache.num_slots, "kv_bytes_per_token": plain.cache.kv_bytes_per_token,
           "num_gpus": plain.num_gpus}
    payload = json.dumps({"config": old, "cost_constants": plain.cost.constants, "digests": plain.digests},
                         sort_keys=True, separators=(",", ":"))
    assert plain.key == hashlib.sha256(payload.encode()).hexdigest()[:20]
    for stated in ({"vllm_version": NEWEST_KNOWN}, {"vllm_version": f"v{NEWEST_KNOWN}"},
                   {"preemption_mode": "recompute"}, {"scheduling_policy": "fcfs"}):
        assert resolve(**stated).key == plain.key, stated
    assert resolve(preemption_mode="swap").key != plain.key
    assert resolve(vllm_version="0.10.1").key != plain.key
    assert resolve(scheduling_policy="priority").key != plain.key


def test_a_version_without_its_patch_number_is_the_release_it_names():
    """trial 46: --vllm-version 0.32 is 0.32.0, the default: one key and one stored value, however it is written
    ('0.10' is 0.10.0 likewise; a fourth number or a pre-release tag is kept)."""
    from kvlab.config import resolve
    from kvlab.vllm_rules import NEWEST_KNOWN, canonical_version

    plain = resolve()
    short = NEWEST_KNOWN.rsplit(".", 1)[0]  # 0.32
    for written in (short, f"v{short}", f" {short} "):
        config = resolve(vllm_version=written)
        assert config.key == plain.key, written
        assert config.to_dict()["vllm_version"] == plain.to_dict()["vllm_version"] == NEWEST_KNOWN
        assert config.sizing.vllm_version == NEWEST_KNOWN and "vllm_version" not in config.options()
    old = resolve(vllm_version="0.10")
    assert old.key == resolve(vllm_version="0.10.0").key and old.to_dict()["vllm_version"] == "0.10.0"
    assert resolve(old.options()).key == old.key
    assert canonical_version("0.10.1.1") == "0.10.1.1" and canonical_version("0.20.1rc1") == "0.20.1rc1"


@pytest.mark.parametrize(("alias", "name"), [("vllm+prefix", "vllm"), ("continuous+paged+recompute", "continuous+paged"),
                                             ("vllm-paper+noprefix+recompute", "vllm-paper"),
                                             ("vllm+swap+noprefix", "vllm+noprefix+swap")])
def test_a_strategy_alias_is_one_point_under_its_canonical_name(alias, name):
    plain = resolve_point(expand(parse_cli_args(["-n", "200", "--strategy", name]))[0], "0.1.0")
    spelt = resolve_point(expand(parse_cli_args(["-n", "200", "--strategy", alias]))[0], "0.1.0")
    assert (spelt.key, spelt.strategy, spelt.row) == (plain.key, name, plain.row)


def test_a_preemption_mode_given_or_named_by_the_strategy_is_one_point():
    named = resolve_point(expand(parse_cli_args(["-n", "200", "--strategy", "vllm+swap"]))[0], "0.1.0")
    given = resolve_point(expand(parse_cli_args(["-n", "200", "--preemption-mode", "swap"]))[0], "0.1.0")
    assert (given.key, given.strategy) == (named.key, "vllm+swap") and given.row["preemption_mode"] == "swap"


def test_a_stored_point_names_the_defaults_it_ran_with():
    from kvlab.vllm_rules import NEWEST_KNOWN

    row = resolve_point(expand(parse_cli_args(["-n", "200"]))[0], "0.1.0").row
    assert (row["scheduling_policy"], row["preemption_mode"], row["vllm_version"]) == ("fcfs", "recompute",
                                                                                          NEWEST_KNOWN)


def test_a_cross_product_of_routers_and_counts_runs_each_engine_once():
    """Trial 50: `--replicas 1,2 --router round-robin,least-requests` was refused by its replicas=1 pair ("needs a
    fleet"), `--router round-robin,weighted --router-scorers prefix:1` by round-robin's scorers; one replica behind
    any router is the one engine, and scorers are weighted's. A single value of each is still refused at resolve."""
    from kvlab.sweep.grid import expand

    points = expand({"replicas": ["1", "2"], "router": ["round-robin", "least-requests"]})
    assert [(p["replicas"], p["router"]) for p in points] == [(1, "round-robin"), (2, "round-robin"),
                                                             (2, "least-requests")]
    scored = expand({"replicas": ["2"], "router": ["round-robin", "weighted"], "router_scorers": ["prefix:1"]})
    default = expand({})[0]["router_scorers"]
    assert [(p["router"], p["router_scorers"]) for p in scored] == [("round-robin", default), ("weighted", "prefix:1")]
    alone = expand({"replicas": ["1"], "router": ["least-requests"]})
    assert [(p["replicas"], p["router"]) for p in alone] == [(1, "least-requests")]  # (resolve says why it cannot)


def test_router_scorer_sets_are_separated_by_semicolons():
    """Trial 50: `--router-scorers prefix:1,least-kv:1` was swept as two sets, split on the set's own commas."""
    lists = parse_cli_args(["--router", "weighted", "--router-scorers", "prefix:1,least-kv:1;prefix:2", "--rate", "1,2"])
    assert lists["router_scorers"] == ["prefix:1,least-kv:1", "prefix:2"] and lists["rate"] == ["1", "2"]


@pytest.mark.parametrize("text", ["5_0", "+100", "1e3"])
def test_a_whole_number_option_takes_digits_only(text):
    """'5_0' and '+100' are what Python's int() takes, not what a person types for a count: refused as the CLI
    refuses them (trial 51: the sweep computed 50 and 100 blocks)."""
    with pytest.raises(KvlabError, match=f"--num-gpu-blocks '{re.escape(text)}': not a whole number"):
        expand(parse_cli_args(["--num-gpu-blocks", f"{text},600"]))
