"""The clock's terms beyond the roofline (kvlab/cost/terms.py): tensor-parallel all-reduce, MoE experts read per
iteration, FP8 matmuls; each changes the clock and nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.catalog import get_gpu, get_model
from kvlab.config import resolve
from kvlab.cost.model import CostModel
from kvlab.cost.profiles import profile_from_dict
from kvlab.cost.terms import terms_for
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import load_workload

ALL_TERMS = {"bandwidth_efficiency": 0.7, "attention_bandwidth_efficiency": 0.9, "flops_efficiency": 0.6,
             "attention_flops_efficiency": 0.6, "overhead_s": 0.002, "seq_overhead_s": 2e-5,
             "prefill_token_overhead_s": 1e-6, "request_latency_s": 0.01, "allreduce_link_efficiency": 0.5,
             "allreduce_latency_s": 1e-5, "sampler_logit_s": 1e-10}


def _profile(constants=ALL_TERMS):
    return profile_from_dict({"name": "all-terms", "kind": "efficiency", "source": "test", "constants": constants},
                             "test")


def test_allreduce_is_two_one_shot_all_reduces_per_layer_reading_every_peer():
    model, gpu = get_model("llama-2-7b"), get_gpu("H100-SXM")
    terms = terms_for(model, gpu, model.weights_bytes(tensor_parallel_size=2) / 2, 2)
    # 32 layers x 2 all-reduces x (tp - 1) peers x 4096 activations x 2 bytes (vLLM's one-shot custom all-reduce)
    assert terms.allreduce_bytes_per_token == 32 * 2 * 1 * 4096 * 2
    assert terms.num_allreduce_calls == 64 and terms.link_bandwidth == 450e9
    cost = resolve(model="llama-2-7b", gpu="H100-SXM", tensor_parallel_size=2, num_gpu_blocks=1000,
                   cost=_write(ALL_TERMS)).engine.cost
    assert cost.token_overhead_s == pytest.approx(32 * 2 * 4096 * 2 / (450e9 * 0.5), rel=1e-12)
    assert cost.overhead_s == pytest.approx(0.002 + 64 * 1e-5, rel=1e-12)
    # At tp 4 each GPU reads the message from 3 peers: 3x tp 2's bytes and per-peer latencies (a ring: 1.5x)
    four = terms_for(model, gpu, model.weights_bytes(tensor_parallel_size=4) / 4, 4)
    assert four.allreduce_bytes_per_token == 32 * 2 * 3 * 4096 * 2 and four.num_allreduce_calls == 64 * 3
    single = terms_for(model, gpu, model.weights_bytes(), 1)
    assert single.allreduce_bytes_per_token == 0 and single.num_allreduce_calls == 0


def test_a_profile_without_the_link_constant_prices_no_all_reduce():
    constants = {k: v for k, v in ALL_TERMS.items() if not k.startswith("allreduce")}
    cost = resolve(model="llama-2-7b", gpu="H100-SXM", tensor_parallel_size=2, num_gpu_blocks=1000,
                   cost=_write(constants)).engine.cost
    assert cost.token_overhead_s == 0.0 and cost.overhead_s == 0.002


def test_the_sampler_costs_each_sequence_its_models_whole_vocabulary_on_every_tp_rank():
    # Llama-2-7B's 32,000 logits against Qwen2.5-7B's 152,064: vLLM's sampler works over the whole gathered row
    for model, vocab in (("llama-2-7b", 32_000), ("qwen2.5-7b-instruct", 152_064)):
        for tp in (1, 2):
            cost = resolve(model=model, gpu="H100-SXM", tensor_parallel_size=tp, num_gpu_blocks=1000,
                           cost=_write(ALL_TERMS)).engine.cost
            assert cost.seq_overhead_s == pytest.approx(2e-5 + vocab * 1e-10, rel=1e-12)
    without = {k: v for k, v in ALL_TERMS.items() if k != "sampler_logit_s"}
    cost = resolve(model="qwen2.5-7b-instruct", gpu="H100-SXM", num_gpu_blocks=1000, cost=_write(without)).engine.cost
    assert cost.seq_overhead_s == 2e-5


def test_moe_reads_the_distinct_experts_its_tokens_touch():
    model = get_model("mixtral-8x7b-v0.1")
    terms = terms_for(model, get_gpu("H100-SXM"), model.weights_bytes(), 1)
    per_expert = 32 * 3 * 4096 * 14336 * 2  # 32 layers x (gate, up, down) x hidden x intermediate x bf16
    assert terms.expert_bytes == per_expert and terms.num_experts == 8 and terms.experts_per_token == 2
    assert terms.dense_weights_bytes == model.weights_bytes() - 8 * per_expert
    cost = CostModel(weights_bytes=1.0, kv_bytes_per_token=0.0, flops_per_token=0.0, attention_flops_per_pair=0.0,
                     memory_bandwidth=1.0, peak_flops=1.0, bandwidth_efficiency=1.0, overhead_s=0.0,
                     expert_read_s=1.0, num_experts=8, experts_per_token=2)
    # One token reads its 2 experts; T tokens 8 (1 - (3/4)^T); a large batch all 8.
    assert cost.iteration_times(1, 0, 1, 0, 0) == pytest.approx(1.0 + 2.0)
    assert cost.iteration_times(3, 0, 3, 0, 0) == pytest.approx(1.0 + 8 * (1 - 0.75**3))
    assert cost.iteration_times(256, 0, 256, 0, 0) == pytest.approx(9.0)
    assert cost.terms(3, 0, 3, 0, 0).weights == pytest.approx(1.0 + 8 * (1 - 0.75**3))


def test_an_fp8_model_multiplies_at_the_gpus_fp8_rate_where_it_has_one():
    scout = get_model("llama-4-scout-17b-fp8")
    on_h100 = terms_for(scout, get_gpu("H100-SXM"), scout.weights_bytes(tensor_parallel_size=2) / 2, 2)
    assert on_h100.matmul_peak_flops == 1978.9e12 and on_h100.attention_peak_flops == 989.4e12
    on_a100 = terms_for(scout, get_gpu("A100-80GB"), scout.weights_bytes(tensor_parallel_size=2) / 2, 2)
    assert on_a100.matmul_peak_flops == on_a100.attention_peak_flops == 312e12  # no FP8: weight-only, bf16 math
    assert on_h100.expert_bytes == pytest.approx(48 * 3 * 5120 * 8192 * 1 / 2)  # fp8: a byte a weight, split by TP


@pytest.mark.parametrize("model, tp", [("mixtral-8x7b-v0.1", 2), ("llama-2-7b", 4)])
def test_every_term_keeps_one_cost_function_for_numbers_arrays_and_decode_runs(model, tp):
    cost = resolve(model=model, gpu="H100-SXM", tensor_parallel_size=tp, num_gpu_blocks=4000,
                   cost=_write(ALL_TERMS)).engine.cost
    assert cost.has_cpu_terms and cost.token_overhead_s > 0 and (cost.has_experts == (model != "llama-2-7b"))
    rng = np.random.default_rng(2)
    num_seqs = rng.integers(1, 256, 300)
    prefill = rng.integers(0, 2048, 300) * (rng.random(300) < 0.3)
    decode = np.minimum(num_seqs, rng.integers(0, 256, 300))
    context = rng.integers(0, 200_000, 300)
    array = cost.iteration_times(num_seqs, prefill, decode, context, context)
    for i in range(300):
        args = (int(num_seqs[i]), int(prefill[i]), int(decode[i]), int(context[i]), int(context[i]))
        assert cost.iteration_times(*args) == array[i]
        assert cost.terms(*args).total == pytest.approx(array[i], rel=1e-12)
    for num_seqs_, context_, k in ((1, 0, 5), (7, 1000, 31), (64, 5000, 40), (255, 123_457, 200)):
        got = cost.decode_times(num_seqs_, context_, k)
        assert [float(t) for t in got] == [cost.iteration_times(num_seqs_, 0, num_seqs_, c, c)
                                           for c in range(context_, context_ + k * num_seqs_, num_seqs_)]


def _steps(engine, workload):
    sim = Simulation(parse_strategy("vllm+prefix"), engine, workload, max_iterations=1)
    steps, clock = [], []
    while not sim.done:
        out = sim.step()
        steps.append((out.num_scheduled_tokens, out.new_req_ids, out.preempted_req_ids))
        clock.append(sim.now)
    return steps, clock


@pytest.mark.parametrize("model, tp", [("mixtral-8x7b-v0.1", 2), ("llama-2-7b", 4)])
def test_the_new_terms_change_the_clock_and_nothing_else(model, tp, tmp_path):
    """Everyone at once (no arrival depends on the clock), a cache small enough to preempt, prefix sharing: the
    same steps under the roofline and under every new term on; only the times differ."""
    config = tmp_path / "shared-prefix.yaml"
    config.write_text("data: {type: shared_prefix, shared_prefix: {num_groups: 3, num_prompts_per_group: 4, "
                      "system_prompt_len: 300, question_len: 200, output_len: 120}}\n"
                      "load: {type: constant, stages: [{rate: 10, duration: 8}]}\n")
    workload = load_workload(str(config), arrival="burst")

    def engine(cost):
        return resolve(model=model, gpu="H100-SXM", tensor_parallel_size=tp, num_gpu_blocks=300,
                       max_model_len=2048, cost=cost).engine

    base, with_terms = _steps(engine("roofline"), workload), _steps(engine(_write(ALL_TERMS, tmp_path)), workload)
    assert any(preempted for _, _, preempted in base[0])
    assert base[0] == with_terms[0]
    assert base[1] != with_terms[1]


def _write(constants, folder=None) -> str:
    import json
    import tempfile
    from pathlib import Path

    folder = Path(folder or tempfile.mkdtemp())
    path = folder / "all-terms.json"
    path.write_text(json.dumps({"name": "all-terms", "kind": "efficiency", "source": "test",
                                "constants": constants}))
    return str(path)


def test_the_admission_lag_puts_one_of_its_own_decode_iterations_on_a_busy_arrivals_ttft_and_end():
    from kvlab.cost.latency import as_seen_by_clients
    from kvlab.metrics import RequestRecord
    from kvlab.sim import SimResult

    def record(i, arrival, scheduled, first, finish):
        return RequestRecord(i, arrival, 100, 11, "finished", scheduled, first, finish, 0)

    records = [record(0, 0.0, 0.0, 0.05, 1.05),  # found the engine idle: scheduled at once
               record(1, 0.5, 0.52, 0.6, 1.6)]  # arrived mid-iteration: 10 decode iterations of 0.1 s
    result = SimResult(strategy=None, config=None, workload_name="", records=records, counters=None, integral=None,
                       log=None, makespan=1.6)
    seen = as_seen_by_clients(result, 0.0, 1.0).records
    assert seen[0] == records[0]
    assert seen[1].first_token_time == pytest.approx(0.7) and seen[1].finish_time == pytest.approx(1.7)
    assert as_seen_by_clients(result, 0.0, 0.0) is result


@pytest.mark.parametrize("name", ["vllm", "orca-max", "static+paged", "vllm+swap", "continuous+pow2"])
def test_the_golden_strategies_schedule_the_same_steps_with_every_new_term_on(name, tmp_path):
    """The golden runs' setup (tests/test_golden.py) at TP 2, everyone at once: the same steps under the roofline
    and under all-reduce, CPU terms, request latency and the admission lag."""
    workload = load_workload("paper-sharegpt", num_requests=120, arrival="burst", seed=0)

    def steps(cost):
        engine = resolve(model="opt-13b", gpu="a100-40gb", available_kv_gib=12, tensor_parallel_size=2,
                         swap_space=4, cost=cost).engine
        sim = Simulation(parse_strategy(name), engine, workload, max_iterations=1)
        out = []
        while not sim.done:
            step = sim.step()
            out.append((step.num_scheduled_tokens, step.new_req_ids, step.preempted_req_ids))
        return out, sim.now

    base, with_terms = steps("roofline"), steps(_write({**ALL_TERMS, "admission_lag_iterations": 1.0}, tmp_path))
    assert base[0] == with_terms[0] and base[1] != with_terms[1]


# The calibration set's dense models (../shared/data/real-vllm): layers, KV heads, head_dim from their config.json
# (Mistral-NeMo's head_dim is 128, not hidden / heads = 160), and the parameter counts their model cards give.
CALIBRATION_MODELS = [
    ("llama-2-7b", 1, 32, 32, 6_738_415_616),
    ("qwen2.5-7b-instruct", 1, 28, 4, 7_615_616_512),
    ("mistral-nemo-12b", 1, 40, 8, 12_247_782_400),
    ("mistral-nemo-12b", 2, 40, 8, 12_247_782_400),
    ("yi-34b", 2, 60, 8, 34_388_917_248),
    ("llama-3.1-70b", 4, 80, 8, 70_553_706_496),
]


@pytest.mark.parametrize("model, tp, layers, kv_heads, params", CALIBRATION_MODELS)
def test_a_decode_step_reads_each_models_own_kv_and_weight_bytes(model, tp, layers, kv_heads, params):
    """The bytes the clock reads per GPU (issue 29's per-model ITL errors): K and V of every layer's KV heads (GQA:
    its own count, split by TP), bf16; every weight once (untied embeddings and LM head both counted)."""
    cost = resolve(model=model, gpu="H100-SXM", tensor_parallel_size=tp, num_gpu_blocks=1000,
                   cost="vllm-h100").engine.cost
    assert cost.kv_bytes_per_token == 2 * layers * (kv_heads // tp) * 128 * 2
    assert cost.weights_bytes == pytest.approx(params * 2 / tp, rel=2e-3)
    assert cost.flops_per_token == pytest.approx(2 * params / tp, rel=2e-3)


def _steps_and_records(workload, constants, tmp_path):
    """vllm's steps (tokens, admissions, preemptions) and its records by request id, under a profile of ``constants``."""
    from kvlab.service.engine import finish, start

    config = resolve(model="llama-2-7b", gpu="H100-SXM", num_gpu_blocks=2000, cost=_write(constants, tmp_path))
    _, (sim,) = start(config, [parse_strategy("vllm")], workload=workload)
    steps = []
    while not sim.done:
        step = sim.step()
        steps.append((step.num_scheduled_tokens, step.new_req_ids, step.preempted_req_ids))
    return steps, {r.request_id: r for r in finish(sim).records}


def test_the_lags_spread_changes_only_the_clock_each_request_by_its_own_seeded_draw(tmp_path):
    """lag_jitter_iterations (kvlab/cost/latency.py, an experiment): put on the records after the engine, so the run
    schedules the same steps; each request's first token and end move by its draw times the constant times its own
    mean decode iteration (so its time per output token does not move), and the same run gives the same numbers."""
    from kvlab.cost.latency import jitter_draws

    workload = load_workload("paper-sharegpt", num_requests=80, arrival="poisson", rate=4.0, seed=0)

    def run(constants):
        return _steps_and_records(workload, constants, tmp_path)

    lagged = {**ALL_TERMS, "admission_lag_iterations": 1.0}
    base_steps, base = run(lagged)
    steps, spread = run({**lagged, "lag_jitter_iterations": 0.5})
    assert steps == base_steps
    draws = jitter_draws(sorted(base))
    assert len(set(draws.round(9))) == len(draws)  # (not the same for every request)
    for i, r in base.items():
        s = spread[i]
        assert (s.arrival_time, s.first_scheduled_time) == (r.arrival_time, r.first_scheduled_time)
        iteration = (r.finish_time - r.first_token_time) / max(1, r.num_output_tokens - 1)  # (the lag moves both)
        assert s.first_token_time - r.first_token_time == pytest.approx(0.5 * draws[i] * iteration, abs=1e-12)
        assert s.finish_time - s.first_token_time == pytest.approx(r.finish_time - r.first_token_time, abs=1e-12)
    assert run({**lagged, "lag_jitter_iterations": 0.5})[1] == spread  # (seeded: the same run, the same numbers)


def test_the_lags_step_changes_only_the_clock_one_iteration_for_a_seeded_few(tmp_path):
    """lag_step_probability (kvlab/cost/latency.py, an experiment): put on the records after the engine, so the run
    schedules the same steps; a request moves by exactly one of its own mean decode iterations or not at all, the
    ones that move are those whose draw X has exp(-X) < q (about q of them), its time per output token does not
    move, and the same run gives the same numbers."""
    from kvlab.cost.latency import jitter_draws

    workload = load_workload("paper-sharegpt", num_requests=200, arrival="poisson", rate=4.0, seed=0)

    def run(constants):
        return _steps_and_records(workload, constants, tmp_path)

    lagged = {**ALL_TERMS, "admission_lag_iterations": 1.0}
    base_steps, base = run(lagged)
    steps, stepped = run({**lagged, "lag_step_probability": 0.2})
    assert steps == base_steps
    chosen = np.exp(-jitter_draws(sorted(base))) < 0.2
    assert 0.1 < chosen.mean() < 0.3  # (about q of them, not all, not none)
    for i, r in base.items():
        s = stepped[i]
        assert (s.arrival_time, s.first_scheduled_time) == (r.arrival_time, r.first_scheduled_time)
        iteration = (r.finish_time - r.first_token_time) / max(1, r.num_output_tokens - 1)
        assert s.first_token_time - r.first_token_time == pytest.approx(chosen[i] * iteration, abs=1e-12)
        assert s.finish_time - s.first_token_time == pytest.approx(r.finish_time - r.first_token_time, abs=1e-12)
    assert run({**lagged, "lag_step_probability": 0.2})[1] == stepped  # (seeded: the same run, the same numbers)


def test_a_step_probability_above_one_is_one_line_naming_it(tmp_path):
    from kvlab.cost.profiles import get_profile
    from kvlab.errors import KvlabError

    with pytest.raises(KvlabError, match=r"lag_step_probability = 1.5 must be in \[0, 1\]"):
        get_profile(_write({**ALL_TERMS, "lag_step_probability": 1.5}, tmp_path))
