"""One front door (issue 20): one resolved configuration and one run service, so one question gets one answer
wherever it is asked. The spellings of one configuration store one row; a stored row holds resolved, typed
values; a bad value gets one message from every face; the library, the CLI and a sweep run the same thing."""

from __future__ import annotations

import json

import pytest

from kvlab.config import OPTIONS, resolve
from kvlab.errors import KvlabError

SPELLINGS = [(), ("--cost", "roofline"), ("--max-model-len", "2048"), ("--model", "OPT-13B")]


def _store(path):
    import duckdb

    return duckdb.connect(str(path / "sweep.duckdb"), read_only=True)


def test_four_spellings_of_one_configuration_are_one_stored_row(kvlab, tmp_path):
    out = tmp_path / "sweep"
    for spelling in SPELLINGS:
        r = kvlab("sweep", "--rate", "1", "-n", "60", "--workers", "1", *spelling, "--out", out, "--json")
        assert r.exit_code == 0, r.stderr
        assert r.json()["num_computed"] == (0 if spelling else 1), spelling
    db = _store(out)
    assert db.execute("select count(*) from points").fetchone()[0] == 1
    assert db.execute("select count(*) from computations").fetchone()[0] == 1
    # Defaults are stored as what they resolve to, so a query by value finds them.
    assert db.execute("select count(*) from points where cost = 'roofline' and max_model_len = 2048 "
                      "and model = 'opt-13b' and tensor_parallel_size = 1").fetchone()[0] == 1


def test_a_stored_row_holds_resolved_values_in_typed_columns(kvlab, tmp_path):
    out = tmp_path / "sweep"
    r = kvlab("sweep", "--rate", "1", "-n", "40", "--workers", "1", "--out", out)
    assert r.exit_code == 0, r.stderr
    types = dict(_store(out).execute("select column_name, data_type from information_schema.columns "
                                     "where table_name = 'points'").fetchall())
    for count in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks", "block_size",
                  "tensor_parallel_size", "num_requests", "seed", "num_slots"):
        assert types[count] == "BIGINT", count
    assert types["rate"] == types["gpu_memory_utilization"] == "DOUBLE"
    assert types["cost"] == types["model"] == "VARCHAR"
    row = _store(out).execute("select num_gpu_blocks, num_slots, block_size, max_num_seqs from points").fetchone()
    config = resolve(rate=1.0, num_requests=40)
    assert row == (config.cache.num_gpu_blocks, config.cache.num_slots, 16, 256)


def test_capacity_under_a_second_profile_recomputes_only_that_profiles_points(kvlab, tmp_path):
    out = tmp_path / "capacity"
    args = ("capacity", "--strategy", "vllm", "-n", "150", "--rtol", "0.3", "--workers", "1", "--out", out, "--json")
    first = kvlab(*args)
    assert first.exit_code == 0, first.stderr
    roofline_probes = first.json()["capacities"][0]["num_simulations"]
    both = kvlab(*args, "--cost", "roofline,vidur-a100")
    assert both.exit_code == 0, both.stderr
    capacities = {c["cost"]: c for c in both.json()["capacities"]}
    assert capacities["roofline"]["num_simulations"] == roofline_probes  # the same search, read from the store
    # (each search on two samples: the workload and twice it)
    assert both.json()["num_computed"] == sum(capacities["vidur-a100"]["samples"]["num_simulations"])
    counts = [n for (n,) in _store(out).execute("select count(*) from computations group by key").fetchall()]
    assert counts and set(counts) == {1}  # each simulation computed once


@pytest.mark.parametrize("args", [
    ("run", "vllm", "-n", "10"), ("race", "-n", "10"), ("size", "opt-13b", "--gpu", "a100-40gb"),
    ("fit", "opt-13b", "--gpu", "a100-40gb"), ("sweep", "-n", "10"), ("capacity", "-n", "10"),
    ("vllm", "compare", "-n", "10"),
])
def test_a_bad_value_gets_the_same_message_from_every_face(kvlab, tmp_path, args):
    """One check, one message, everywhere: an option one face accepts and another refuses is a bug."""
    out = ("--out", tmp_path / "out") if args[0] in ("sweep", "capacity") else ()
    r = kvlab(*args, "--max-num-seqs", "0", *out)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "--max-num-seqs 0 is out of range; valid: requests per step, a whole number from 1 to 1,048,576" \
        in r.stderr
    assert "Traceback" not in r.stderr


def test_resolution_fills_every_default_names_things_one_way_and_is_idempotent():
    config = resolve()
    values = config.to_dict()
    assert all(values[name] is not None for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens",
                                                      "num_gpu_blocks", "tensor_parallel_size", "cost", "rate"))
    assert resolve(model="facebook/opt-13b", gpu="A100-40GB", cost="roofline").key == config.key
    assert resolve(config.options()) == config and resolve(config.options()).key == config.key
    assert resolve(seed=1).key != config.key and resolve(block_size=32).key != config.key


def test_a_file_changed_since_is_another_configuration(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0,10,5\n0.5,20,5\n")
    before = resolve(workload=str(trace))
    trace.write_text("arrival_time,prompt_len,output_len\n0,10,5\n0.5,20,6\n")
    assert resolve(workload=str(trace)).key != before.key
    assert before.workload.workload == str(trace.resolve())  # an absolute path, whatever the working folder


def test_an_unknown_option_names_itself_and_the_options_that_exist(tmp_path):
    with pytest.raises(KvlabError, match=r"unknown option 'max_num_seq' \(did you mean 'max_num_seqs'\?\); the "
                                         r"options are: model, "):
        resolve(max_num_seq=4)
    grid = tmp_path / "grid.yaml"
    grid.write_text("strategy: vllm\nmax_num_seq: 4\n")
    from kvlab.sweep.grid import read_grid_file

    with pytest.raises(KvlabError, match=r"'max_num_seq' is not an option a sweep or capacity search takes: did you mean "
                                         r"--max-num-seqs\? the options they vary are"):
        read_grid_file(grid)


def test_every_declared_option_is_a_flag_of_kvlab_run_with_its_declared_default(kvlab):
    """The command line is generated from the declarations: each option once, spelt as declared."""
    import inspect

    from kvlab.cli.sim import sim_option_template

    params = inspect.signature(sim_option_template).parameters
    assert list(params) == list(OPTIONS)
    for name, option in OPTIONS.items():
        assert params[name].default == option.default, name
    help_text = " ".join(kvlab("run", "--help").stdout.split())
    for option in OPTIONS.values():
        assert option.flag in help_text, option.flag


def test_the_library_the_cli_and_a_sweep_point_give_one_answer(kvlab, tmp_path):
    from kvlab import service
    from kvlab.sweep.point import simulate_point

    options = {"model": "opt-13b", "rate": 2.0, "num_requests": 120, "seed": 3}
    library = service.simulate(["vllm"], **options).results[0].summary()
    cli = kvlab("run", "vllm", "--rate", "2", "-n", "120", "--seed", "3", "--json").json()["strategies"][0]
    point, _ = simulate_point({"strategy": "vllm", **{n: o.default for n, o in OPTIONS.items()}, **options})
    point.pop("window")  # (a sweep point also keeps its measured window: kvlab.window)
    cli.pop("typical_iteration")  # (the command line explains the time of an iteration beside the summary)
    for summary in (cli, point):
        assert json.dumps(summary, sort_keys=True) == json.dumps(library, sort_keys=True)


def test_a_block_size_vllm_would_refuse_runs_with_a_note(kvlab):
    r = kvlab("run", "vllm", "-n", "20", "--block-size", "8")
    assert r.exit_code == 0, r.stderr
    assert "--block-size 8: vLLM's CUDA attention backends take multiples of 16" in " ".join(r.stderr.split())
    size = kvlab("size", "opt-13b", "--gpu", "a100-40gb", "--block-size", "8")
    assert size.exit_code == 0 and "would refuse it" in " ".join(size.stderr.split())
    assert "GPU KV cache size" in size.stdout


def test_a_config_file_sets_options_and_a_flag_wins(kvlab, tmp_path):
    """`kvlab run --config FILE`, as `vllm serve --config`: the file's options, the command line's flags over them;
    a name that is no option is refused with the options there are."""
    path = tmp_path / "serve.yaml"
    path.write_text("model: llama-3.1-8b\ngpu: h100-sxm\nmax-num-seqs: 64\nnum_requests: 30\n")
    r = kvlab("run", "vllm", "--config", path, "--max-num-seqs", "32", "--json")
    assert r.exit_code == 0, r.stderr
    setup = r.json()["setup"]
    assert (setup["model"], setup["gpu"], setup["max_num_seqs"]) == ("llama-3.1-8b", "H100-SXM", 32)
    assert r.json()["workload"]["num_requests"] == 30
    toml = tmp_path / "serve.toml"
    toml.write_text('model = "llama-3.1-8b"\nmax_num_seqs = 64\nnum_requests = 30\n')
    assert kvlab("run", "vllm", "--config", toml, "--json").json()["setup"]["max_num_seqs"] == 64
    path.write_text("max_num_seq: 4\n")
    bad = kvlab("run", "vllm", "--config", path)
    assert bad.exit_code == 2
    assert "'max_num_seq' is not an option (did you mean 'max_num_seqs'?); the options are: model, dtype" in bad.stderr
    path.write_text("max_num_seqs: 0\n")
    assert f"--config {path}: max_num_seqs 0 is out of range" in kvlab("run", "vllm", "--config", path).stderr


def test_a_bad_value_in_a_config_file_names_the_file(kvlab, tmp_path):
    """Trial 49: `--config c.yaml` with `rate: -3` said '--rate -3 is out of range', as if typed on the command line."""
    path = tmp_path / "c.yaml"
    path.write_text("rate: -3\n")
    r = kvlab("run", "vllm", "--config", path)
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"error: --config {path}: rate -3 is out of range; valid: requests per second, a number "
                                "> 0 and ≤ 1,000,000,000")


def test_a_vllm_serve_config_file_s_server_keys_are_passed_over_with_a_note(kvlab, tmp_path):
    """Trial 49b: a config file written for `vllm serve` (port, host, served-model-name) was refused, though --config
    reads files 'as vllm serve --config'; the engine's options in it still apply."""
    path = tmp_path / "serve.yaml"
    path.write_text("port: 8000\nhost: 0.0.0.0\nmax-num-seqs: 48\nserved-model-name: mine\n")
    r = kvlab("run", "vllm", "-n", "10", "--config", path, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["setup"]["max_num_seqs"] == 48
    assert (f"note: --config {path}: port, host, served-model-name only set vLLM's server (its HTTP side, logs, "
            "tokenizer or loading), not its engine: passed over") in " ".join(r.stderr.split())
