"""One configuration, built once and passed down; vLLM's refusals made in one place; strategy names in one table."""

from __future__ import annotations

import dataclasses

import pytest

from kvlab.config import CacheConfig, ModelConfig, SchedulerConfig, SimConfig, resolve
from kvlab.errors import KvlabError
from kvlab.sim import Simulation
from kvlab.strategies import ALLOCATOR_NAMES, BATCHING_NAMES, PREEMPTION_MODES, parse_strategy
from kvlab.workload import Workload
from kvlab.workload.request import Request


@pytest.fixture(scope="module")
def paper_config() -> SimConfig:
    return resolve(model="opt-13b", gpu="a100-40gb", available_kv_gib=12).engine


def test_from_options_builds_each_sub_config_from_the_sizing(paper_config):
    cfg = paper_config
    assert cfg.model == ModelConfig(model="opt-13b", dtype="float16")
    # Table 1 of the vLLM paper: 12 GB of KV cache for OPT-13B hold 15.7K tokens, in blocks of 16.
    assert cfg.cache.num_slots == 15_728 and cfg.cache.block_size == 16 and cfg.cache.num_gpu_blocks == 983
    assert cfg.cache.kv_cache_dtype == "float16"
    assert cfg.cache.kv_bytes_per_token == 2 * 40 * 5120 * 2  # K and V, 40 layers, hidden 5,120, fp16
    assert cfg.cache.swap_space_bytes == 4 * 2**30
    assert cfg.scheduler == SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=2048)
    assert cfg.gpu == "A100-40GB" and cfg.cost.profile == "roofline"


@pytest.mark.parametrize("max_model_len", [100, 500, 2048])
def test_the_simulated_pool_has_the_blocks_the_calculator_reports(kvlab, max_model_len):
    # vLLM's "GPU KV cache size" counts whole max_model_len requests (864 blocks / 7 per 100-token request x 100
    # = 12,342 tokens); its block pool, and so kvlab's, holds all 864 blocks of 16 (the newest rules: Model Runner
    # V2's penalty state, 256 x (50,272 + 1,571) x 4 B, and its grammar bitmask, 256 x 1,571 x 4 B, are counted
    # against the budget).
    size = kvlab("size", "opt-13b", "--gpu", "a100-40gb", "--max-model-len", str(max_model_len), "--json").json()
    cfg = resolve(model="opt-13b", gpu="a100-40gb", max_model_len=max_model_len).engine
    assert cfg.cache.num_gpu_blocks == size["num_blocks"] == 864
    assert cfg.cache.num_slots == 864 * 16


def test_the_simulation_hands_the_scheduler_its_config_with_the_strategys_batching_and_preemption(paper_config):
    wl = Workload("one", (Request(0, 0.0, 8, 4),), "", "")
    static = Simulation(parse_strategy("static+max"), paper_config, wl)
    assert static.scheduler.config == dataclasses.replace(paper_config.scheduler, batching="static",
                                                          preemption_mode="recompute")
    swap = Simulation(parse_strategy("vllm+swap"), paper_config, wl)
    assert swap.scheduler.config.preemption_mode == "swap"
    assert swap.scheduler.preemption.capacity_bytes == paper_config.cache.swap_space_bytes
    # --preemption-mode on the config overrides the strategy's own mode.
    swapping = dataclasses.replace(paper_config, scheduler=dataclasses.replace(paper_config.scheduler,
                                                                               preemption_mode="swap"))
    assert Simulation(parse_strategy("vllm"), swapping, wl).scheduler.config.preemption_mode == "swap"
    assert paper_config.scheduler.batching == "continuous"  # the config itself is never changed


# vLLM's refusals of scheduler settings, whoever builds them: `kvlab run`, `kvlab size`, the real-engine settings.
REFUSALS = [
    (dict(max_num_seqs=16, max_num_batched_tokens=8, max_model_len=512),
     "--max-num-batched-tokens (8) must be at least --max-num-seqs (16)"),
    (dict(max_num_batched_tokens=256, max_model_len=512, enable_chunked_prefill=False),
     "without chunked prefill, --max-num-batched-tokens (256) must be at least --max-model-len (512)"),
]


@pytest.mark.parametrize(("settings", "message"), REFUSALS)
def test_vllms_scheduler_refusals_are_made_in_one_place_for_every_caller(settings, message):
    from kvlab.vllm.job import EngineSettings

    with pytest.raises(KvlabError) as built:
        SchedulerConfig(**settings)
    with pytest.raises(KvlabError) as run:
        resolve(model="opt-13b", **settings)
    with pytest.raises(KvlabError) as real:
        EngineSettings(block_size=32, num_gpu_blocks_override=64, **settings).check()
    assert str(built.value).startswith(message)
    assert str(built.value) == str(run.value) == str(real.value)


def test_sizing_refuses_a_token_budget_below_the_seats_with_the_same_words():
    from kvlab.catalog import get_gpu, get_model
    from kvlab.sizing import SizingConfig, size_kv_cache

    with pytest.raises(KvlabError) as sized:
        size_kv_cache(get_model("opt-13b"), SizingConfig.for_gpu(get_gpu("a100-40gb"), max_num_batched_tokens=1))
    with pytest.raises(KvlabError) as built:
        SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=1)
    assert str(sized.value) == str(built.value)


def test_a_config_spanning_two_parts_is_checked_where_they_meet():
    from kvlab.cost import CostModel

    cost = CostModel(weights_bytes=1.0, kv_bytes_per_token=1.0, flops_per_token=1.0, attention_flops_per_pair=1.0,
                     memory_bandwidth=1.0, peak_flops=1.0)
    with pytest.raises(KvlabError, match="a block must fit in a sequence"):
        SimConfig(CacheConfig(num_slots=256, block_size=32), cost, SchedulerConfig(max_model_len=16,
                                                                                   max_num_batched_tokens=16,
                                                                                   max_num_seqs=16))
    with pytest.raises(KvlabError, match="--swap-space GiB > 0"):
        SimConfig(CacheConfig(num_slots=256, swap_space_bytes=0), cost, SchedulerConfig(preemption_mode="swap"))
    with pytest.raises(KvlabError, match="num_slots must be positive"):
        CacheConfig(num_slots=0)


def test_strategy_names_live_in_one_table_that_the_engines_dispatch_follows():
    from kvlab import defaults
    from kvlab.memory import ALLOCATORS
    from kvlab.paper import FIG2_PAPER, FIG2_SYSTEMS
    from kvlab.sched.batching import BATCHING
    from kvlab.sched.preemption import PREEMPTION
    from kvlab.strategies import LESSON_RACE, PAPER_SYSTEMS

    assert set(BATCHING) == set(BATCHING_NAMES)
    assert tuple(ALLOCATORS) == ALLOCATOR_NAMES
    assert set(PREEMPTION) == set(PREEMPTION_MODES)
    assert defaults.RACE_STRATEGIES is LESSON_RACE
    assert FIG2_SYSTEMS is PAPER_SYSTEMS and tuple(FIG2_PAPER) == PAPER_SYSTEMS
    for name in (*defaults.STORY, *LESSON_RACE, *PAPER_SYSTEMS):
        parse_strategy(name)
    with pytest.raises(KvlabError, match="batching 'fifo'; valid: static, continuous"):
        SchedulerConfig(batching="fifo")
    with pytest.raises(KvlabError, match="--preemption-mode 'drop'; valid: recompute, swap"):
        SchedulerConfig(preemption_mode="drop")


def test_more_gpu_blocks_than_the_gpu_holds_are_refused_as_a_budget_is():
    """trial 46, finding 6: --num-gpu-blocks 50000 (610 GiB of KV on a 40 GB card) was simulated without a word, while
    --available-kv-gib 500 was refused. The same physical check now: the blocks must fit beside the weights; a real
    run's printed count (vLLM's own sizing, here 864) and up to the GPU's room still run."""
    from kvlab.config import resolve

    with pytest.raises(KvlabError, match=r"^--num-gpu-blocks 50,000 is more than A100-40GB can hold for the KV cache "
                                         r"of opt-13b: .* 15.55 GiB; valid: at most 1,274 blocks"):
        resolve(num_gpu_blocks=50_000)
    assert resolve(num_gpu_blocks=864).cache.num_gpu_blocks == 864
    assert resolve(num_gpu_blocks=1274).cache.num_gpu_blocks == 1274
    assert resolve(num_gpu_blocks=2000, gpu="a100-80gb").cache.num_gpu_blocks == 2000
