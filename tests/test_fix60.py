"""fix60: one strategy spelt twice in a sweep, a router given twice to kvlab capacity, and --arrivals SEED|even on
`kvlab run` / `kvlab race` for an inference-perf workload."""

from __future__ import annotations

import pytest


def test_a_sweep_refuses_one_strategy_spelt_twice_naming_both_spellings(kvlab, tmp_path):
    # (vllm+prefix is vllm: one simulation, and the sweep made one point of the two asked for without a word)
    out = tmp_path / "sweep"
    r = kvlab("sweep", "--strategy", "vllm,vllm+prefix", "-n", "20", "--workers", "1", "--out", out)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == ("error: --strategy vllm,vllm+prefix: 'vllm+prefix' is the same strategy as 'vllm' "
                                "(both run vllm: one simulation, one point), given twice; valid: each strategy once")
    assert not out.exists()


def test_a_sweep_refuses_a_spelling_of_the_preemption_mode_a_strategy_already_has(kvlab, tmp_path):
    r = kvlab("sweep", "--strategy", "orca-oracle,vllm,vllm+recompute", "-n", "20", "--workers", "1",
              "--out", tmp_path / "sweep")
    assert r.exit_code == 2 and "'vllm+recompute' is the same strategy as 'vllm' (both run vllm" in r.stderr


def test_a_sweep_keeps_the_rule_for_one_value_given_twice_and_distinct_strategies_run(kvlab, tmp_path):
    r = kvlab("sweep", "--strategy", "vllm,vllm", "-n", "20", "--workers", "1", "--out", tmp_path / "a")
    assert "error: --strategy vllm,vllm: 'vllm' is the same value as 'vllm', given twice; valid: each value once" \
        in r.stderr
    r = kvlab("sweep", "--strategy", "vllm,vllm+noprefix", "-n", "20", "--workers", "1", "--out", tmp_path / "b",
              "--json")
    assert r.exit_code == 0, r.stderr
    assert [p["strategy"] for p in r.json()["points"]] == ["vllm", "vllm+noprefix"]


def test_capacity_still_answers_each_spelling_of_one_strategy(kvlab, tmp_path):
    # (the refusal is the sweep's: capacity answers vllm and vllm+prefix each, as tests/test_capacity_real_traces.py)
    r = kvlab("capacity", "--strategy", "vllm,vllm+prefix", "--cost", "roofline", "-n", "200", "--workers", "1",
              "--out", tmp_path / "c", "--json")
    assert r.exit_code == 0, r.stderr
    by_name = {c["strategy"]: c for c in r.json()["capacities"]}
    assert set(by_name) == {"vllm", "vllm+prefix"}
    assert by_name["vllm"]["capacity_rps"] == by_name["vllm+prefix"]["capacity_rps"]


@pytest.mark.parametrize("args", [
    ["--replicas", "auto", "--rate", "2", "--router", "round-robin,round-robin"],
    ["--replicas", "auto", "--rate", "2", "--router", "least-requests,round-robin,least-requests"],
    ["--replicas", "auto", "--prefill-replicas", "auto", "--rate", "2", "--router", "round-robin,round-robin"],
    ["--rate", "2", "--router", "round-robin,round-robin"],
])
def test_capacity_refuses_a_router_given_twice_as_any_value_given_twice(kvlab, tmp_path, args):
    out = tmp_path / "cap"
    r = kvlab("capacity", *args, "-n", "50", "--max-time", "1s", "--out", out)
    router = args[args.index("--router") + 1]
    twice = router.split(",")[0]
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (f"error: --router {router}: {twice!r} is the same value as {twice!r}, given twice; "
                                "valid: each value once")
    assert not out.exists()


IP_CONFIG = """\
data:
  type: shared_prefix
  shared_prefix:
    num_groups: 2
    num_prompts_per_group: 4
    system_prompt_len: 200
    question_len: 50
    output_len: 20
load:
  type: constant
  stages:
    - {rate: 4.0, duration: 10}
    - {rate: 8.0, duration: 5}
"""


@pytest.fixture
def ip_yaml(tmp_path):
    path = tmp_path / "ip.yaml"
    path.write_text(IP_CONFIG)
    return path


def _arrivals(path, arrivals, **options):
    from kvlab import service
    from kvlab.cli.options import with_arrivals
    from kvlab.config.resolve import quietly

    config = with_arrivals(quietly({"workload": str(path), **options}), arrivals)
    return [r.arrival_time for r in service.load(config).requests]


@pytest.mark.parametrize("arrivals, seed", [(None, 0), ("0", 0), ("3", 3), ("even", None), (" Even ", None)])
def test_arrivals_draws_the_configurations_times_with_the_seed_asked_for_or_evenly_spaced(ip_yaml, arrivals, seed):
    from kvlab.workload.inference_perf import arrival_times, read_config

    assert _arrivals(ip_yaml, arrivals) == arrival_times(read_config(str(ip_yaml)), seed=seed).tolist()


def test_the_configurations_default_draw_is_the_workloads_one():
    from kvlab.config.resolve import WorkloadConfig
    from kvlab.workload.inference_perf import DEFAULT_SEED

    assert WorkloadConfig().arrival_seed == DEFAULT_SEED


def test_arrivals_even_on_a_rescaled_configuration_rescales_the_evenly_spaced_times(ip_yaml):
    from kvlab.workload.arrivals import rescale_arrivals
    from kvlab.workload.inference_perf import arrival_times, read_config

    times = rescale_arrivals(arrival_times(read_config(str(ip_yaml)), seed=None), 2.0)
    assert _arrivals(ip_yaml, "even", rate=2.0) == pytest.approx(times.tolist())


@pytest.mark.parametrize("command", [["run"], ["race", "vllm", "orca-max"]])
def test_run_and_race_take_arrivals_and_say_which_in_the_workloads_description(kvlab, ip_yaml, command):
    runs = {a: kvlab(*command, "-w", ip_yaml, *(["--arrivals", a] if a else []), "--json") for a in ("", "0", "even")}
    assert all(r.exit_code == 0 for r in runs.values()), [r.stderr for r in runs.values()]
    described = {a: r.json()["workload"]["description"] for a, r in runs.items()}
    assert described[""] == described["0"] and described[""].endswith("arrivals drawn as its timer draws them "
                                                                       "(--arrivals 0).")
    assert described["even"].endswith("arrivals evenly spaced (--arrivals even).")
    assert runs[""].json()["strategies"] == runs["0"].json()["strategies"]
    assert runs[""].json()["strategies"] != runs["even"].json()["strategies"]


VALID = ("valid: --arrivals SEED (one seed of inference-perf's drawn arrivals, a whole number from 0; default 0) or "
         "--arrivals even (evenly spaced at each stage's rate)")


@pytest.mark.parametrize("args, message", [
    (["--arrivals", "even"], "error: --arrivals even: workload paper-sharegpt is not an inference-perf configuration "
     "(a .yaml file), whose constant timer --arrivals draws; valid: leave --arrivals out (--arrival and --rate set "
     "other workloads' arrivals), or --workload CONFIG.yaml"),
    (["-w", "IP", "--arrival", "poisson", "--rate", "3", "--arrivals", "1"], "error: --arrivals 1 with --arrival "
     "poisson: poisson arrivals are drawn anew for the configuration's rows, not at its own times; valid: one of the two"),
    (["-w", "IP", "--arrivals", "0,1"], f"error: --arrivals 0,1: a run replays one draw, not 2; {VALID} (kvlab "
     "calibrate --runs --arrivals pools several)"),
    (["-w", "IP", "--arrivals", "-1"], f"error: --arrivals '-1' is not an arrival seed; {VALID}"),
    (["-w", "IP", "--arrivals", "1.5"], f"error: --arrivals '1.5' is not an arrival seed; {VALID}"),
])
@pytest.mark.parametrize("command", ["run", "race"])
def test_arrivals_where_it_does_not_apply_or_not_a_seed_is_one_line(kvlab, ip_yaml, command, args, message):
    r = kvlab(command, *[str(ip_yaml) if a == "IP" else a for a in args])
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == message and r.stdout == ""
