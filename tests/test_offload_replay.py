"""Measured runs served with vLLM's CPU KV offloading replay through kvlab's CPU tier (kvlab.offload).

The runs are the calibration set's (../shared/data/real-vllm/trainval.json) with the offload fields set as the public
sim-to-real benchmark writes them for its runs with offloading (kvlab/cost/measured.py: cpu_offload true, cpu_kv_blocks
the 8 GiB over one GPU's share of a block), and a short load so that each replay takes a moment.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest

from kvlab.cost import fit as F
from kvlab.cost.measured import run_from_dict
from kvlab.errors import KvlabError
from kvlab.offload.config import GIB


@functools.cache
def _trainval() -> list[dict]:
    """../shared/data/real-vllm/trainval.json beside the repository, found as benchmarks/real_vllm.py finds it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("real_vllm", Path(__file__).parents[1] / "benchmarks/real_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return json.loads(module.default_runs().read_text(encoding="utf-8"))["experiments"]


PROMPT = 150 + 600 + 37  # run 64's system prompt, question and chat template (kvlab/cost/measured.py)
OUTPUT = 251  # its answers


def _run(run_id: str, **fields) -> dict:
    """A calibration run, 60 requests at 4 per second (its users' prompts come back from request 50 on)."""
    raw = copy.deepcopy(next(r for r in _trainval() if r["id"] == run_id))
    raw["workload"]["stages"] = [{"rate": 4.0, "duration": 15}]
    raw.update(fields)
    return raw


ARRIVALS = [None, (0,), (3,)]  # evenly spaced, and two of inference-perf's drawn workloads (fit.ARRIVAL_SEEDS')


def _simulate(raw: dict, seeds=None):
    """The run on one workload: evenly spaced (``None``) or one draw (``(seed,)``), where ``F.prepare`` by default
    draws four and the replay pools them (its sums would be over four workloads where the simulation below runs one).
    Stepped, to see each preemption: returns (prepared, result, the tokens each preempted request held (its prompt
    and what it had generated), the tokens computed for each at its next admission)."""
    prepared = F.prepare(run_from_dict(raw, "held-out.json, run 0"), arrival_seeds=seeds)
    sim = F._simulation(prepared, prepared.engine(F.START), prepared.workload.requests)
    held, again, preempted = [], [], set()
    while not sim.done:
        out = sim.step()
        if out is None:
            break
        again += [out.num_scheduled_tokens.get(i, 0) for i in out.new_req_ids if i in preempted]
        preempted -= set(out.new_req_ids)
        held += [sim.seqs[i].num_tokens for i in out.preempted_req_ids]
        preempted |= set(out.preempted_req_ids)
    return prepared, sim.result(), held, again


def test_the_benchmarks_cpu_kv_blocks_are_one_gpus_share_and_vllm_sizes_the_tier_over_every_gpu():
    # Qwen2.5-7B at tp 1: 8 GiB over 57,344 B/token x 16 = 9,362 blocks either way.
    qwen = run_from_dict(_run("64", cpu_offload=True), "x")
    assert (qwen.kv_offloading_size, qwen.num_cpu_blocks) == (8.0, 9362)
    assert F.prepare(qwen).config.offload.num_cpu_blocks == 9362
    from_size = F.prepare(run_from_dict(_run("64", cpu_offload=True, cpu_kv_blocks=0), "x")).config.offload
    assert from_size.num_cpu_blocks == 8 * GIB // from_size.block_bytes == 9362 and from_size.block_bytes == 917504
    # Mistral-Nemo-12B at tp 2: the file's 6,553 counts half-blocks; vLLM's tier holds 3,276 whole ones.
    nemo = run_from_dict(_run("62", cpu_offload="True"), "x")
    assert (nemo.kv_offloading_size, nemo.num_cpu_blocks) == (8.0, 3276)
    offload = F.prepare(nemo).config.offload
    assert offload.num_cpu_blocks == 3276 == 8 * GIB // offload.block_bytes


@pytest.mark.parametrize(("value", "size"), [(None, None), (False, None), ("false", None), (0, None), (True, 8.0),
                                             ("native", 8.0), ("OffloadingConnector", 8.0), (16, 16.0)])
def test_what_cpu_offload_may_say(value, size):
    run = run_from_dict(_run("64", cpu_offload=value, cpu_kv_blocks=0), "x")
    assert run.kv_offloading_size == size and run.num_cpu_blocks is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"cpu_offload": "lmcache"}, r"run '64'\): cpu_offload 'lmcache': kvlab replays vLLM's native CPU tier only"),
    ({"cpu_offload": -8}, r"cpu_offload -8: .*valid: null or false \(no tier\), true, 'native'"),
    ({"cpu_offload": True, "cpu_kv_blocks": 2.5}, r"cpu_kv_blocks = 2.5; valid: a whole number >= 0"),
    ({"cpu_offload": True, "cpu_kv_blocks": 1, "tp": 2}, r"cpu_kv_blocks = 1 at tp 2 is less than one CPU block"),
])
def test_an_offload_kvlab_cannot_replay_is_one_line(fields, message):
    with pytest.raises(KvlabError, match=message):
        run_from_dict(_run("64", **fields), "x")


@pytest.mark.parametrize("seeds", ARRIVALS)
def test_without_offload_nothing_changes(seeds):
    """cpu_offload null (the calibration set's) or false: no tier, whatever cpu_kv_blocks says, and the same replay
    as a run without the fields."""
    bare = _run("64")
    del bare["cpu_offload"], bare["cpu_kv_blocks"]
    reference = F.replay(F.prepare(run_from_dict(bare, "x"), arrival_seeds=seeds), F.START).predicted()
    for value in (None, False):
        prepared, result, _, _ = _simulate(_run("64", cpu_offload=value), seeds)
        assert prepared.config.offload is None and result.counters.kv_offload == {}
        assert F.replay(prepared, F.START).predicted() == reference


@pytest.mark.parametrize("seeds", ARRIVALS)
def test_an_offload_run_replays_through_the_cpu_tier(seeds):
    """A GPU cache of 600 blocks holds about 12 of the 50 users' prompts (787 tokens each); their second rounds
    (requests 50-59) find what the GPU evicted on the CPU. With the GPU's whole cache the tier finds nothing more and
    changes nothing. Drawn arrivals come in bursts that preempt a few requests (evenly spaced, none do)."""
    _, gpu_only, _, _ = _simulate(_run("64", cpu_offload=None, total_kv_blocks=600), seeds)
    prepared, tiered, held, again = _simulate(_run("64", cpu_offload=True, total_kv_blocks=600), seeds)
    stats = tiered.counters.kv_offload
    assert stats["num_cpu_blocks"] == 9362 and stats["offload_evicted_blocks"] == 0
    assert stats["cpu_prefix_hit_tokens"] > 0 and stats["cpu_prefix_hit_tokens"] == 16 * stats["offload_loaded_blocks"]
    assert stats["offload_loaded_bytes"] == stats["offload_loaded_blocks"] * 917504
    assert len(tiered.records) == len(gpu_only.records) == 60
    replay = F.replay(prepared, F.START)
    assert replay.num_preemptions == tiered.counters.num_preemptions == len(held) == len(again)
    assert (len(held) > 0) == (seeds is not None) and len(replay.finish) == 60
    # Every admission computes what its request holds less what either tier holds of it; the tiers' counters are
    # over every admission. A preempted request holds its prompt and the tokens it generated, so its next admission
    # prefills them all, less its hits (its own blocks, freed to the cache, mostly still there): what it computes
    # again is what the prefix cache lost (the scheduler's recomputed tokens) and the token it had sampled last,
    # prefilled now where it would have been decoded.
    prefill, decode = replay.phi[:, 6].sum(), replay.fields[2].sum()
    assert prefill == 60 * PROMPT + sum(held) - stats["gpu_prefix_hit_tokens"] - stats["cpu_prefix_hit_tokens"]
    decoding = sum(1 for n in held if n > PROMPT)  # (preempted after its first token)
    assert decode == 60 * (OUTPUT - 1) - decoding
    assert sum(again) == tiered.counters.num_recomputed_tokens + decoding
    # The tier's hits are computed less.
    assert F.replay(F.prepare(run_from_dict(_run("64", total_kv_blocks=600), "x"), arrival_seeds=seeds),
                    F.START).phi[:, 6].sum() > prefill
    whole = _run("64", cpu_offload=True)  # (65,352 GPU blocks)
    plain = _run("64", cpu_offload=None)
    prepared_whole, result_whole, _, _ = _simulate(whole, seeds)
    assert result_whole.counters.kv_offload["cpu_prefix_hit_tokens"] == 0
    assert F.replay(prepared_whole, F.START).predicted() == F.replay(
        F.prepare(run_from_dict(plain, "x"), arrival_seeds=seeds), F.START).predicted()
