"""The job kvlab hands to the real-engine driver: token ids, output lengths, arrival steps, vLLM's refusals."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.vllm.job import FIRST_TOKEN_ID, VOCAB_SIZE, EngineSettings, build_job, prompt_token_ids
from kvlab.workload.request import Request

SETTINGS = EngineSettings(block_size=32, num_gpu_blocks_override=64, max_num_seqs=8, max_num_batched_tokens=256,
                          max_model_len=512)


def test_shared_prefix_tokens_are_equal_and_the_rest_differs():
    a = Request(1, 0.0, prompt_len=100, output_len=5, prefix_hashes=(7, 8), prefix_chunk_len=32)
    b = Request(2, 0.0, prompt_len=90, output_len=5, prefix_hashes=(7, 9), prefix_chunk_len=32)
    ta, tb = prompt_token_ids(a), prompt_token_ids(b)
    assert len(ta) == 100 and len(tb) == 90
    assert ta[:32] == tb[:32]  # chunk of hash id 7
    assert ta[32:64] != tb[32:64]  # hash ids 8 and 9
    assert ta[64:90] != tb[64:90]  # unique to each request
    assert all(FIRST_TOKEN_ID <= t < VOCAB_SIZE for t in ta + tb)
    assert prompt_token_ids(a) == ta  # deterministic


def test_two_requests_never_have_identical_prompts():
    # Both prompts lie entirely inside the same shared prefix: only the last token tells them apart.
    a = Request(1, 0.0, prompt_len=64, output_len=5, prefix_hashes=(3, 4), prefix_chunk_len=32)
    b = Request(2, 0.0, prompt_len=64, output_len=5, prefix_hashes=(3, 4), prefix_chunk_len=32)
    ta, tb = prompt_token_ids(a), prompt_token_ids(b)
    assert ta[:63] == tb[:63]
    assert ta != tb


def test_build_job_fixes_output_lengths_and_arrival_steps():
    requests = [Request(0, 0.0, 40, output_len=30, max_tokens=12), Request(1, 0.5, 50, output_len=7)]
    job = build_job(requests, [0, 3], SETTINGS)
    assert [r["max_tokens"] for r in job["requests"]] == [12, 7]
    assert [r["add_before_step"] for r in job["requests"]] == [0, 3]
    assert [r["request_id"] for r in job["requests"]] == ["0", "1"]
    assert job["engine"]["block_size"] == 32 and job["engine"]["num_gpu_blocks_override"] == 64


@pytest.mark.parametrize("block_size", [16, 48])
def test_block_size_must_be_a_multiple_of_32(block_size):
    with pytest.raises(KvlabError, match="multiple of 32"):
        EngineSettings(block_size=block_size, num_gpu_blocks_override=64).check()


def test_the_pool_must_hold_one_request_of_max_model_len_plus_the_null_block():
    # max_model_len 256 = 8 blocks of 32, plus the null block: 9 is the least vLLM starts with.
    EngineSettings(block_size=32, num_gpu_blocks_override=9, max_num_seqs=4, max_num_batched_tokens=64,
                   max_model_len=256).check()
    with pytest.raises(KvlabError, match="at least 9 blocks"):
        EngineSettings(block_size=32, num_gpu_blocks_override=8, max_num_seqs=4, max_num_batched_tokens=64,
                       max_model_len=256).check()


def test_requests_vllm_would_reject_are_refused_before_starting_it():
    with pytest.raises(KvlabError, match="max_model_len=512"):
        build_job([Request(0, 0.0, 512, 3)], [0], SETTINGS)
    with pytest.raises(KvlabError, match="n=2"):
        build_job([Request(0, 0.0, 10, 3, n=2)], [0], SETTINGS)
    with pytest.raises(KvlabError, match="one per request"):
        build_job([Request(0, 0.0, 10, 3)], [0, 1], SETTINGS)
