"""Speculative decoding (kvlab.spec) as vLLM V1's scheduler counts it: a decoding request schedules the token it
sampled last and its k drafts (slots taken), the rejected drafts come off ``num_computed_tokens`` (their slots go
back to reserved; the blocks stay), the EAGLE family reserves k lookahead slots. Tiny pools at exact block ids;
invariants on any input; the run scheduler equal to the stepping reference with it on; the mean acceptance
length against the formula."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.config import resolve
from kvlab.config.engine import SchedulerConfig
from kvlab.errors import KvlabError
from kvlab.memory.paged import PagedAllocator
from kvlab.sched.seq import SeqStatus
from kvlab.sim import Simulation
from kvlab.spec.config import SpeculativeConfig, expected_tokens_per_step
from kvlab.spec.cost import draft_seconds
from kvlab.spec.lookahead import LookaheadPagedAllocator
from kvlab.spec.scheduler import RejectionSampler, SpecRunScheduler, SpecScheduler, SpecSeq
from kvlab.strategies import parse_strategy
from kvlab.workload import Workload, load_workload
from kvlab.workload.request import Request


def _sched(cls, rates, method="ngram", k=3, num_blocks=12, block_size=4, budget=64, max_num_seqs=8):
    speculative = SpeculativeConfig(method, k, rates)
    allocator = (LookaheadPagedAllocator if speculative.num_lookahead_tokens else PagedAllocator)(
        num_blocks, block_size, max_model_len=256)
    if speculative.num_lookahead_tokens:  # (a compiled PagedAllocator takes no attribute it does not declare)
        allocator.num_lookahead_tokens = speculative.num_lookahead_tokens
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=256)
    return cls(config, allocator, speculative=speculative), allocator


def _step(sched, t):
    out = sched.schedule()
    sched.update_from_output(out, float(t))
    return out


@pytest.mark.parametrize("cls", [SpecScheduler, SpecRunScheduler])
def test_drafts_take_slots_and_the_rejected_give_them_back(cls):
    # Draft position 0 always accepted, 1 and 2 never: each verify step yields 2 tokens of the 4 it computed.
    sched, allocator = _sched(cls, (1.0, 0.0, 0.0))
    seq = SpecSeq(Request(0, 0.0, 6, 12))
    sched.add_request(seq)
    out = _step(sched, 1)  # the prompt: 6 tokens in blocks 1-2, the first token sampled, 3 drafts proposed
    assert out.num_scheduled_tokens == {0: 6} and out.num_decode_tokens == 0
    assert (seq.num_computed_tokens, seq.num_output_tokens, seq.num_spec_tokens) == (6, 1, 3)
    assert allocator.get_block_ids(0) == [1, 2]
    out = _step(sched, 2)  # token 6 and drafts 7, 8, 9: 10 slots, block 3 taken
    assert out.num_scheduled_tokens == {0: 4} and out.num_decode_tokens == 4 and out.num_prefill_tokens == 0
    assert allocator.get_block_ids(0) == [1, 2, 3]
    # Drafts 8 and 9 rejected: computed 10 - 2 = 8 (vLLM's num_computed_tokens -= num_rejected); 1 accepted + 1 sampled.
    assert (seq.num_computed_tokens, seq.num_output_tokens) == (8, 3)
    assert sched.num_resident_computed_tokens == 8
    # The rejected slots are reserved again (the block stays with the request, as in vLLM).
    snap = allocator.snapshot([seq])
    assert (snap.token[3], snap.reserved[3]) == (0, 4) and (snap.token[2], snap.reserved[2]) == (4, 0)
    allocator.check_invariants([seq])
    out = _step(sched, 3)  # token 8 and drafts 9-11 over slots 8..11: block 3 still holds them
    assert out.num_scheduled_tokens == {0: 4} and allocator.get_block_ids(0) == [1, 2, 3]
    assert (seq.num_computed_tokens, seq.num_output_tokens) == (10, 5)
    stats = sched.spec_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 6, 2)
    assert stats.num_accepted_tokens_per_pos == [2, 0, 0]


@pytest.mark.parametrize("cls", [SpecScheduler, SpecRunScheduler])
def test_drafts_stop_at_the_answer_and_a_full_acceptance_finishes_in_fewer_steps(cls):
    sched, allocator = _sched(cls, (1.0,))
    seq = SpecSeq(Request(0, 0.0, 6, 10))
    sched.add_request(seq)
    scheduled = []
    t = 0
    while sched.num_unfinished:
        t += 1
        scheduled.append(_step(sched, t).num_scheduled_tokens[0])
    # 1 token from the prompt, 4 + 4 from two verify steps, and the last from one without drafts (left 1).
    assert scheduled == [6, 4, 4, 1]
    assert seq.status is SeqStatus.FINISHED and seq.num_output_tokens == 10
    assert allocator.free_block_ids()[:4] == [4, 3, 2, 1]  # freed tail first


def test_eagle_reserves_lookahead_slots_and_ngram_does_not():
    for method, blocks in (("ngram", [1, 2, 3]), ("eagle", [1, 2, 3, 4])):
        sched, allocator = _sched(SpecScheduler, (0.0,), method=method)
        seq = SpecSeq(Request(0, 0.0, 6, 12))
        sched.add_request(seq)
        _step(sched, 1)  # a prompt gets no lookahead (vLLM: effective lookahead 0 while nothing is computed)
        assert allocator.get_block_ids(0) == [1, 2]
        _step(sched, 2)  # tokens 6..9, and with eagle 3 lookahead slots: 13 slots, 4 blocks
        assert allocator.get_block_ids(0) == blocks
        assert (seq.num_computed_tokens, seq.num_output_tokens) == (7, 2)  # every draft rejected
        allocator.check_invariants([seq])


def test_the_budget_trims_the_drafts():
    sched, _ = _sched(SpecScheduler, (1.0,), budget=6, max_num_seqs=2)
    seqs = [SpecSeq(Request(i, 0.0, 3, 20)) for i in range(2)]
    for seq in seqs:
        sched.add_request(seq)
    assert _step(sched, 1).num_scheduled_tokens == {0: 3, 1: 3}  # two prompts of 3
    out = _step(sched, 2)  # the first verifies its token and 3 drafts; the second gets what is left: 1 draft
    assert out.num_scheduled_tokens == {0: 4, 1: 2} and out.num_decode_tokens == 6
    assert [s.num_output_tokens for s in seqs] == [5, 3]
    assert sched.spec_stats.num_draft_tokens == 4


def test_a_preempted_request_loses_its_drafts():
    sched, allocator = _sched(SpecScheduler, (0.0,), num_blocks=5)
    a, b = SpecSeq(Request(0, 0.0, 4, 30)), SpecSeq(Request(1, 0.0, 4, 30))
    for seq in (a, b):
        sched.add_request(seq)
    _step(sched, 1)
    assert allocator.get_block_ids(0) == [1] and allocator.get_block_ids(1) == [2]
    out = _step(sched, 2)  # each takes a block for 4 + 3 tokens: 3 and 4
    assert out.num_scheduled_tokens == {0: 4, 1: 4} and allocator.num_free_blocks == 0
    out = _step(sched, 3)  # a needs none (6 + 4 = 10 > 8: it does), b is evicted for it
    assert out.preempted_req_ids == (1,) and b.num_spec_tokens == 0 and b.status is SeqStatus.PREEMPTED


@pytest.mark.parametrize("rates", [(0.7,), (0.9, 0.6, 0.3), (0.0,), (1.0,)])
def test_the_samplers_mean_acceptance_length_is_the_formula(rates):
    k = 3
    per_position = rates * k if len(rates) == 1 else rates
    sampler = RejectionSampler(per_position, seed=5)
    n = 60_000
    mean = 1 + sum(sampler.num_accepted(k) for _ in range(n)) / n
    expected = expected_tokens_per_step(per_position)
    assert mean == pytest.approx(expected, abs=0.02)
    if len(rates) == 1 and rates[0] < 1:
        a = rates[0]
        assert expected == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def _config(**options):
    return resolve(model="llama-2-7b", gpu="a100-80gb", max_model_len=2048, **options).engine


def test_a_simulations_mean_acceptance_length_and_tokens_per_step_match_vllms_formula():
    config = _config(num_gpu_blocks=2000, speculative_method="eagle", num_speculative_tokens=4,
                     spec_acceptance="0.8")
    workload = Workload("long", tuple(Request(i, 0.1 * i, 100, 1500) for i in range(20)), "", "")
    result = Simulation(parse_strategy("vllm"), config, workload).run()
    summary = result.summary()
    expected = expected_tokens_per_step((0.8,) * 4)
    assert summary["spec_mean_acceptance_length"] == pytest.approx(expected, rel=0.02)
    assert summary["spec_mean_acceptance_length"] == 1 + summary["spec_num_accepted_tokens"] / summary["spec_num_drafts"]
    assert summary["spec_acceptance_per_position"]["1"] == pytest.approx(0.8, abs=0.02)
    assert {r.status for r in result.records} == {"finished"} and sum(r.num_output_tokens for r in result.records) == 30000
    # Tokens per request and engine step: about `expected` (one per step without speculative decoding).
    assert 30000 / result.integral.sum_batch_size == pytest.approx(expected, rel=0.02)
    plain = Simulation(parse_strategy("vllm"), _config(num_gpu_blocks=2000), workload).run()
    assert plain.integral.sum_batch_size == 30000


def test_drafting_costs_time_by_method():
    config = _config(num_gpu_blocks=2000)
    cost = config.cost
    from kvlab.sched.output import SchedulerOutput

    out = SchedulerOutput(step=1, num_scheduled_tokens={0: 4, 1: 4}, new_req_ids=(), preempted_req_ids=(),
                          num_prefill_tokens=0, num_decode_tokens=8, num_context_tokens=600, num_attention_pairs=2000)
    one_pass = cost.iteration_times(2, 0, 2, 600, 600)
    assert draft_seconds(SpeculativeConfig("ngram", 3, (0.5,)), cost, out) == 0.0
    eagle = resolve(model="llama-2-7b", gpu="a100-80gb", speculative_method="eagle", spec_acceptance="0.5").speculative
    assert eagle.draft_cost_ratio == 1 / 32
    assert draft_seconds(eagle, cost, out) == pytest.approx(3 * one_pass / 32)
    draft = resolve(model="llama-2-13b", gpu="a100-80gb", speculative_method="draft_model",
                    speculative_model="llama-2-7b", spec_acceptance="0.5").speculative
    assert 0.4 < draft.draft_cost_ratio < 0.6  # 7B against 13B


@pytest.mark.parametrize("args, message", [
    (["--speculative-method", "ngram", "--num-speculative-tokens", "0", "--spec-acceptance", "0.5"],
     "--num-speculative-tokens 0 is out of range"),
    (["--speculative-method", "ngram", "--spec-acceptance", "1.5"], "--spec-acceptance 1.5 is out of range; valid: a "
     "probability from 0 to 1"),
    (["--speculative-method", "ngram", "--spec-acceptance", "-0.1"], "--spec-acceptance -0.1 is out of range"),
    (["--speculative-method", "ngram", "--spec-acceptance", "0.9/0.8"], "2 rates for 3 speculative tokens"),
    (["--speculative-method", "ngram", "--spec-acceptance", "high"], "'high' is not a number"),
    (["--speculative-method", "ngram"], "needs --spec-acceptance"),
    (["--spec-acceptance", "0.5"], "--spec-acceptance 0.5 needs --speculative-method"),
    (["--num-speculative-tokens", "4"], "--num-speculative-tokens 4 needs --speculative-method"),
    (["--speculative-method", "ngram", "--speculative-model", "opt-125m", "--spec-acceptance", "0.5"],
     "--speculative-model opt-125m: --speculative-method ngram drafts from the prompt's own n-grams, with no model"),
    (["--speculative-method", "draft_model", "--spec-acceptance", "0.5"], "needs --speculative-model"),
    (["--speculative-method", "draft_model", "--speculative-model", "opt-13b", "--spec-acceptance", "0.7"],
     "--speculative-model opt-13b is the target model itself (opt-13b)"),
    (["--speculative-method", "mtp", "--spec-acceptance", "0.7"], "--speculative-method mtp: opt-13b has no MTP head "
     "(its config has neither num_nextn_predict_layers nor mtp_num_hidden_layers) and vLLM refuses it; valid: a "
     "model with MTP layers (in the catalogue: deepseek-v3;"),
    (["--speculative-method", "medusa", "--spec-acceptance", "0.5"], "--speculative-method 'medusa' is not one"),
])
def test_bad_speculative_settings_are_named_in_one_line(kvlab, args, message):
    r = kvlab("run", "vllm", "-n", "10", *args)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_slabs_are_refused_with_speculative_decoding():
    config = _config(num_gpu_blocks=500, speculative_method="ngram", spec_acceptance="0.5")
    with pytest.raises(KvlabError, match="needs paged memory"):
        Simulation(parse_strategy("orca-oracle"), config, load_workload("paper-sharegpt", num_requests=5, rate=1.0))


def test_without_speculative_decoding_the_summary_has_no_spec_fields():
    summary = Simulation(parse_strategy("vllm"), _config(num_gpu_blocks=500),
                         load_workload("paper-sharegpt", num_requests=20, rate=1.0)).run().summary()
    assert not any(key.startswith("spec_") for key in summary)


# -- runs == stepping, and invariants on any input ------------------------------------------------------------

def _stepping_reference(strategy, config, workload) -> Simulation:
    """A simulation whose scheduler is the stepping reference with speculative decoding (SpecScheduler)."""
    sim = Simulation(strategy, config, workload, max_iterations=1)
    sched = sim.scheduler
    sim.scheduler = SpecScheduler(sched.config, sim.allocator, config.cache, speculative=config.speculative)
    return sim


@pytest.mark.parametrize("strategy, method, rates, policy, timeout", [
    ("vllm", "ngram", "0.6", "fcfs", None),
    ("vllm+prefix", "eagle", "0.9/0.6/0.3", "fcfs", None),
    ("vllm", "eagle", "0.8", "priority", 25.0),
    ("static+paged", "draft_model", "0.5", "fcfs", None),
])
def test_the_run_scheduler_with_speculative_decoding_is_the_stepping_reference(strategy, method, rates, policy,
                                                                               timeout):
    config = _config(num_gpu_blocks=600, speculative_method=method, spec_acceptance=rates, scheduling_policy=policy,
                     **({"speculative_model": "llama-3.2-1b"} if method == "draft_model" else {}))
    workload = load_workload("paper-sharegpt", num_requests=250, rate=8.0, seed=1, arrival="poisson")
    workload = dataclasses.replace(workload, requests=tuple(
        dataclasses.replace(r, priority=r.request_id % 3, timeout=timeout) for r in workload.requests))
    strategy = parse_strategy(strategy)
    stepped = _stepping_reference(strategy, config, workload)
    runs = Simulation(strategy, config, workload)
    t = stepped.start_time
    while not (stepped.done and runs.done):
        t += 7.3
        stepped.run_until(t)
        runs.run_until(t)
        assert runs.now == stepped.now
        assert ({s.request_id: runs.allocator.get_block_ids(s.request_id) for s in runs.scheduler.running}
                == {s.request_id: stepped.allocator.get_block_ids(s.request_id) for s in stepped.scheduler.running})
        assert runs.allocator.free_block_ids() == stepped.allocator.free_block_ids()
    a, b = stepped.result(), runs.result()
    assert b.records == a.records and b.counters == a.counters
    assert a.counters.spec_decoding["spec_num_drafts"] > 0
    for name, column in a.log.columns.items():
        assert list(b.log.columns[name]) == list(column), name
    if runs.config.scheduler.scheduling_policy == "fcfs":
        assert a.counters.num_preemptions > 0 or strategy.batching == "static"


@settings(max_examples=50, deadline=None)
@given(specs=st.lists(st.tuples(st.floats(0, 3), st.integers(1, 300), st.integers(1, 200),
                                st.one_of(st.none(), st.floats(0.05, 3))), min_size=1, max_size=25),
       num_blocks=st.integers(30, 80), k=st.integers(1, 6), rate=st.floats(0, 1),
       method=st.sampled_from(["ngram", "eagle"]), prefix=st.booleans())
def test_no_block_is_lost_or_owned_twice_and_every_request_ends(specs, num_blocks, k, rate, method, prefix):
    config = resolve(model="llama-2-7b", gpu="a100-80gb", num_gpu_blocks=num_blocks, block_size=16,
                     max_model_len=1024, max_num_batched_tokens=1024, speculative_method=method,
                     num_speculative_tokens=k, spec_acceptance=str(rate)).engine
    requests = sorted((Request(i, t, p, o, timeout=to, prefix_hashes=(1,) if prefix else (), prefix_chunk_len=32)
                       for i, (t, p, o, to) in enumerate(specs)), key=lambda r: (r.arrival_time, r.request_id))
    workload = Workload("h", tuple(dataclasses.replace(r, request_id=i) for i, r in enumerate(requests)), "", "")
    sim = Simulation(parse_strategy("vllm+prefix" if prefix else "vllm"), config, workload, max_iterations=1)
    while not sim.done:
        if sim.step() is None:
            break
        running = sim.scheduler.running
        sim.allocator.check_invariants(running, in_running_order=True)
        held = [b for s in running for b in sim.allocator.get_block_ids(s.request_id)]
        if not prefix:
            assert len(held) == len(set(held)), "a block owned twice"
            assert len(held) + sim.allocator.num_free_blocks == num_blocks - 1, "a block lost"
        for seq in running:
            assert seq.num_computed_tokens <= seq.request.num_kv_tokens
    result = sim.result()
    assert {r.status for r in result.records} <= {"finished", "aborted", "rejected"}
    assert len(result.records) == len(requests)
    assert sim.allocator.num_free_blocks == num_blocks - 1
    for record, request in zip(sorted(result.records), workload.requests):
        if record.status == "finished":
            assert record.num_output_tokens == request.num_output_tokens


def test_without_the_features_the_plain_classes_run():
    """The off path pays nothing: the run scheduler, the plain paged allocator and plain requests, no extra time."""
    from kvlab.memory.paged import PagedAllocator as Plain
    from kvlab.sched.runs import RunScheduler
    from kvlab.sched.seq import Seq

    sim = Simulation(parse_strategy("vllm"), _config(num_gpu_blocks=500),
                     load_workload("paper-sharegpt", num_requests=5, rate=1.0))
    assert type(sim.scheduler) is RunScheduler and type(sim.allocator) is Plain and sim._extra_seconds is None
    sim.run()
    assert {type(seq) for seq in sim.seqs.values()} == {Seq}
    # (its own sum, not an alias of num_tokens: mypyc compiles no class attribute bound to a property)
    assert all(seq.num_tokens_with_spec == seq.num_tokens for seq in sim.seqs.values())


def test_a_fleet_of_speculating_replicas_sums_their_counts_and_recomputes_the_rates():
    """Two replicas' speculative-decoding summaries as one (kvlab.fleet.result.summed_counters): the counts add up
    and the rates are those of the summed counts, not sums of rates."""
    from kvlab.fleet.result import summed_counters
    from kvlab.metrics import Counters
    from kvlab.spec.scheduler import SpecDecodeStats

    a, b = SpecDecodeStats(2), SpecDecodeStats(2)
    a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens, a.num_accepted_tokens_per_pos = 10, 20, 12, [8, 4]
    b.num_drafts, b.num_draft_tokens, b.num_accepted_tokens, b.num_accepted_tokens_per_pos = 30, 60, 15, [12, 3]
    one, two = Counters(), Counters()
    one.spec_decoding, two.spec_decoding = a.summary(), b.summary()
    one.kv_offload, two.kv_offload = {"cpu_prefix_hit_tokens": 5}, {"cpu_prefix_hit_tokens": 7}
    total = summed_counters([one, two])
    assert total.spec_decoding["spec_num_drafts"] == 40 and total.spec_decoding["spec_num_accepted_tokens"] == 27
    assert total.spec_decoding["spec_acceptance_rate"] == 27 / 80
    assert total.spec_decoding["spec_mean_acceptance_length"] == 1 + 27 / 40
    assert total.spec_decoding["spec_acceptance_per_position"] == {"1": 20 / 40, "2": 7 / 40}
    assert total.kv_offload == {"cpu_prefix_hit_tokens": 12}
    assert summed_counters([Counters(), Counters()]).spec_decoding == {}


def test_a_draft_model_larger_than_the_target_is_warned_in_one_line(kvlab):
    r = kvlab("run", "vllm", "-n", "5", "--model", "llama-3.2-1b", "--gpu", "H100-SXM", "--speculative-method",
              "draft_model", "--speculative-model", "llama-3.1-8b", "--spec-acceptance", "0.7")
    assert r.exit_code == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "larger than the target" in line]
    assert len(warned) == 1 and "--speculative-model llama-3.1-8b" in warned[0]


def test_a_draft_models_weights_and_kv_are_counted_in_the_budget():
    """trial 46, finding 5: vLLM loads a draft model on the target's GPUs (vllm/v1/spec_decode/draft_model.py:
    DraftModelProposer.load_model), so the startup profile counts its weights and its attention layers take blocks of
    the one KV cache. kvlab had sized the pool for the target alone."""
    plain = resolve()
    spec = resolve(speculative_method="draft_model", speculative_model="llama-3.2-1b", spec_acceptance="0.7")
    draft = spec.speculative
    assert draft.draft_weights_bytes > 2 * 2**30 and draft.draft_kv_bytes_per_token == 16 * 2 * 8 * 64 * 2
    # (the target's budget with its runner's tensors for the draft tokens, as every method's: the grammar bitmask's
    # max_num_seqs x (1 + k) rows; trial 62, finding 9b)
    assert spec.sizing.available_kv_bytes < plain.sizing.available_kv_bytes
    budget = spec.sizing.available_kv_bytes - draft.draft_weights_bytes
    blocks = budget // (plain.sizing.bytes_per_block + 16 * draft.draft_kv_bytes_per_token)
    assert spec.cache.num_gpu_blocks == blocks < plain.cache.num_gpu_blocks
    assert spec.describe()["speculative"]["draft_weights_gib"] == round(draft.draft_weights_bytes / 2**30, 2)
    # a budget vLLM printed was measured with the draft loaded: its weights are not taken off again, its KV is
    given = resolve(available_kv_gib=10, speculative_method="draft_model", speculative_model="llama-3.2-1b",
                    spec_acceptance="0.7")
    assert given.cache.num_gpu_blocks == 10 * 2**30 // (plain.sizing.bytes_per_block + 16 * draft.draft_kv_bytes_per_token)
    # methods without a draft model are sized as before
    assert resolve(speculative_method="ngram", spec_acceptance="0.7").cache.num_slots == plain.cache.num_slots


def test_a_draft_model_that_does_not_fit_beside_the_target_is_refused_in_one_line(kvlab):
    r = kvlab("run", "vllm", "-n", "5", "--speculative-method", "draft_model", "--speculative-model", "llama-3.1-8b",
              "--spec-acceptance", "0.7")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1].startswith(
        "error: --speculative-model llama-3.1-8b: its 14.96 GiB of weights do not fit beside opt-13b on A100-40GB")


def test_a_runs_text_names_its_drafts_and_its_cpu_tier(kvlab):
    r = kvlab("run", "vllm", "-n", "5", "--speculative-method", "eagle", "--spec-acceptance", "0.7",
              "--kv-offloading-size", "8")
    assert r.exit_code == 0, r.stderr
    words = " ".join(r.stdout.split())
    assert "Speculative decoding: eagle, 3 draft tokens per step, acceptance 0.7 (about 2.53 tokens per verify step" \
        in words
    assert "CPU tier: 8 GiB, 655 blocks over PCIe 4.0 x16 (--kv-offloading-size)." in words
    assert "Speculative decoding" not in " ".join(kvlab("run", "vllm", "-n", "5").stdout.split())


def test_mtp_is_taken_on_a_model_with_mtp_layers():
    spec = resolve(model="deepseek-v3", gpu="h200", tensor_parallel_size=8, speculative_method="mtp",
                   spec_acceptance="0.8").speculative
    assert spec is not None and spec.method == "mtp"


def test_a_config_json_with_mtp_layers_takes_mtp(tmp_path):
    import json

    from tests.test_catalog import LLAMA_8B

    path = tmp_path / "with-mtp" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**LLAMA_8B, "num_nextn_predict_layers": 1}))
    spec = resolve(model=str(path), gpu="h100-sxm", speculative_method="mtp", spec_acceptance="0.8").speculative
    assert spec is not None and spec.method == "mtp"
    path.write_text(json.dumps(LLAMA_8B))
    with pytest.raises(KvlabError, match="with-mtp has no MTP head"):
        resolve(model=str(path), gpu="h100-sxm", speculative_method="mtp", spec_acceptance="0.8")


@pytest.mark.parametrize("text, where", [
    ("0.8//0.5/0.3", "'0.8//0.5/0.3': position 2 of 4 is empty"),
    ("0.8//0.5", "'0.8//0.5': position 2 of 3 is empty"),
    ("0.8/0.5/", "'0.8/0.5/': position 3 of 3 is empty"),
    ("/0.8", "'/0.8': position 1 of 2 is empty"),
    (" ", "' ': is empty"),
])
def test_an_empty_acceptance_field_is_refused_by_its_position(kvlab, text, where):
    """trial 51, finding 1: '0.8//0.5/0.3' ran as 0.8/0.5/0.3 (the empty field dropped) and '0.8//0.5' was refused as
    '2 rates for 3 speculative tokens', naming neither the empty field nor where it was."""
    r = kvlab("run", "vllm", "-n", "10", "--speculative-method", "ngram", "--spec-acceptance", text)
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: --spec-acceptance {where}; valid: a probability from 0 to 1, or "
                                             "one per position separated by slashes (0.9/0.7/0.5)"]


@pytest.mark.parametrize("method, says", [
    ("eagle", "--speculative-model llama-3.2-1b: --speculative-method eagle drafts with an EAGLE head, a one-layer "
              "checkpoint trained on the target's hidden states"),
    ("mtp", "--speculative-model llama-3.2-1b: --speculative-method mtp drafts with the target checkpoint's own MTP "
            "layers, with no other model"),
])
def test_a_catalogue_model_is_refused_as_an_eagle_or_mtp_draft(kvlab, method, says):
    """trial 51, finding 2: eagle with --speculative-model llama-3.2-1b shrank the pool by the 1B's weights but priced
    each draft as an EAGLE head (one target layer). vLLM's EAGLE method loads SpeculativeConfig.model as an EAGLE head
    checkpoint (vllm/config/speculative.py wraps its config in EAGLEConfig); a whole catalogue model is not one."""
    model = ["--model", "deepseek-v3", "--gpu", "h200", "-tp", "8"] if method == "mtp" else []
    r = kvlab("run", "vllm", "-n", "10", *model, "--speculative-method", method, "--speculative-model", "llama-3.2-1b",
              "--spec-acceptance", "0.7")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert lines[0].endswith("valid: drop --speculative-model, or --speculative-method draft_model to draft with "
                             "llama-3.2-1b")
    if method == "eagle":
        assert "llama-3.2-1b is a whole model, not an EAGLE head" in lines[0]


def test_num_gpu_blocks_beside_a_draft_model_is_checked_at_the_block_size_with_the_drafts_layers(kvlab):
    """trial 51, finding 9: the fit check of --num-gpu-blocks took the draft's weights off but priced a block at the
    target's layers alone, so 1,085 blocks ran where the blocks, holding the draft's layers too, need 13.77 GiB of the
    13.25 GiB left. The default pool (649 blocks; 650 before the target's grammar bitmask counted the draft tokens) is the budget over the block with both models' layers."""
    spec = resolve(model="opt-13b", gpu="a100-40gb", speculative_method="draft_model", speculative_model="llama-3.2-1b",
                   spec_acceptance="0.7")
    block = spec.sizing.bytes_per_block + 16 * spec.speculative.draft_kv_bytes_per_token
    room = spec.sizing.gpu_memory_bytes - spec.sizing.weights_bytes - spec.speculative.draft_weights_bytes
    fit = room // block
    args = ("run", "vllm", "--model", "opt-13b", "--gpu", "a100-40gb", "-n", "5", "--speculative-method", "draft_model",
            "--speculative-model", "llama-3.2-1b", "--spec-acceptance", "0.7", "--num-gpu-blocks")
    r = kvlab(*args, str(fit + 1))
    assert r.exit_code == 2 and fit == 1043, (fit, r.stderr)
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"error: --num-gpu-blocks 1,044 is more than A100-40GB can hold for the KV cache of opt-13b: 1,044 blocks x "
        f"{block / 2**20:g} MiB with llama-3.2-1b's layers = ")
    assert "valid: at most 1,043 blocks" in r.stderr
    assert kvlab(*args, str(fit)).exit_code == 0
