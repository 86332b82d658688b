"""`kvlab bench` against a local server that misbehaves on demand (fault_server.py): a dropped connection,
HTTP 500 and 429, an error in the stream, a stall past the timeout, Ctrl-C, the time limit; and bad input
(unreachable, not OpenAI-compatible, no or foreign /metrics). Every request must be accounted for exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

from fault_server import DROP, HTTP_429, HTTP_500, MALFORMED, STALL, STREAM_ERROR, FaultServer, FaultState
from vllm_server import free_port

from kvlab.bench.results import read_requests_csv

NORMAL = 12  # tokens of a well-behaved answer


def _workload(tmp_path, output_lens, gap=0.02, prompt_len=10):
    path = tmp_path / "workload.csv"
    lines = ["arrival_time,prompt_len,output_len"]
    lines += [f"{i * gap:.3f},{prompt_len},{n}" for i, n in enumerate(output_lens)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _bench(kvlab, server, workload, *args):
    return kvlab("bench", "--url", server.url, "-w", workload, "--arrival", "trace", *args)


def test_every_fault_is_accounted_for_once(kvlab, fault_server, tmp_path):
    lens = [NORMAL, DROP, NORMAL, HTTP_500, STALL, NORMAL, HTTP_429, STREAM_ERROR, NORMAL, DROP, NORMAL, HTTP_500,
            MALFORMED]
    out = tmp_path / "out"
    result = _bench(kvlab, fault_server, _workload(tmp_path, lens), "--timeout", "1.5", "--out", out)
    assert result.exit_code == 0, result.stderr
    rows = read_requests_csv(out / "requests.csv")
    assert [r["request_id"] for r in rows] == list(range(len(lens)))  # each request once, in order
    assert len(fault_server.state.received) == len(lens)  # each sent once, none retried
    for row, n in zip(rows, lens):
        assert row["requested_output_tokens"] == n
        if n == NORMAL:
            assert (row["status"], row["num_output_tokens"], row["error"]) == ("finished", NORMAL, "")
            assert row["ttft"] > 0 and row["tpot"] > 0 and row["e2e_latency"] >= row["ttft"]
        elif n == DROP:
            assert row["status"] == "failed" and "connection failed after 3 of 7 tokens" in row["error"]
            assert row["num_output_tokens"] == 3 and row["e2e_latency"] is None
        elif n in (HTTP_500, HTTP_429):
            assert row["status"] == "failed" and row["error"].startswith(f"HTTP {500 if n == HTTP_500 else 429}")
            assert row["num_output_tokens"] == 0 and row["first_token_time"] is None
        elif n == STALL:
            assert row["status"] == "timeout" and "within 1.5 s (--timeout): 2 of 9 tokens" in row["error"]
        elif n == STREAM_ERROR:
            assert row["status"] == "failed" and "engine died (injected)" in row["error"]
        elif n == MALFORMED:
            assert row["status"] == "failed" and row["error"] == ("malformed stream after 0 tokens: 'choices' is a "
                                                                 "dict, not a list (not OpenAI's streaming format)")
    summary = json.loads((out / "summary.json").read_text())
    statuses = Counter(r["status"] for r in rows)
    assert (summary["num_finished"], summary["num_failed"], summary["num_timeout"]) == (
        statuses["finished"], statuses["failed"], statuses["timeout"]) == (5, 7, 1)
    assert summary["num_output_tokens_received"] == 5 * NORMAL + 2 * 3 + 2 + 1
    assert summary["preemptions"] is None and summary["server_counters"] is None  # no /metrics to read them from
    tokens = [json.loads(line) for line in (out / "token_times.jsonl").read_text().splitlines()]
    assert [t["request_id"] for t in tokens] == list(range(len(lens)))
    for t, row in zip(tokens, rows):
        assert sum(t["num_tokens"]) == row["num_output_tokens"] and t["times"] == sorted(t["times"])
    # The run says what failed, and that it had no /metrics to read.
    assert "2 × HTTP 500 Internal Server Error: internal error (injected)" in result.stdout
    assert "HTTP 429 Too Many Requests: rate limited (injected)" in result.stdout
    assert "has no /metrics (HTTP 404)" in result.stderr


def test_text_prompts_no_vllm_extensions_and_the_api_key_unprinted(kvlab, fault_server, tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_API_KEY", "sk-very-secret")
    out = tmp_path / "out"
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL, NORMAL], prompt_len=25), "--json", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert not any("sk-very-secret" in path.read_text() for path in out.iterdir())
    body = fault_server.state.received[0]
    assert isinstance(body["prompt"], str) and len(body["prompt"].split()) == 25  # not vLLM: text, ~1 word a token
    assert body["stream"] is True and body["max_tokens"] == NORMAL and "ignore_eos" not in body
    assert body["stream_options"] == {"include_usage": True}
    assert fault_server.state.headers[0]["authorization"] == "Bearer sk-very-secret"
    assert "sk-very-secret" not in result.stdout + result.stderr
    summary = result.json()
    assert summary["num_finished"] == 2 and [r["status"] for r in summary["requests"]] == ["finished"] * 2
    assert summary["client"]["prompt_format"] == "text" and summary["client"]["ignore_eos"] is False


def test_concurrency_caps_the_requests_in_flight(kvlab, fault_server, tmp_path):
    fault_server.state.token_interval = 0.01
    # Every request at t = 0: only --concurrency keeps them from all being open at once.
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL] * 8, gap=0.0), "--concurrency", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert fault_server.state.max_open == 2

    def strict(constant):  # NaN and Infinity are not JSON
        raise AssertionError(f"{constant} in the JSON")

    summary = json.loads(result.stdout, parse_constant=strict)
    assert summary["num_finished"] == 8 and summary["workload"]["rate"] is None  # all at t = 0


def test_time_limit_stops_the_run_and_keeps_every_row(kvlab, fault_server, tmp_path):
    fault_server.state.token_interval = 0.05
    # Two short answers, two long ones still streaming at the limit, two arriving after it.
    lens, gaps = [3, 3, 200, 200, 3, 3], [0.0, 0.0, 0.0, 0.0, 5.0, 5.0]
    path = tmp_path / "workload.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "".join(f"{g},10,{n}\n" for g, n in zip(gaps, lens)))
    result = _bench(kvlab, fault_server, path, "--time-limit", "1.5", "--json")
    assert result.exit_code == 0, result.stderr
    summary = result.json()
    assert summary["stopped"] == "time limit"
    rows = summary["requests"]
    assert [r["status"] for r in rows] == ["finished", "finished", "timeout", "timeout", "timeout", "timeout"]
    assert all("after" in r["error"] for r in rows[2:4]) and all(r["num_output_tokens"] > 0 for r in rows[2:4])
    assert all(r["error"].startswith("not sent: the run's time limit of 1.5 s") for r in rows[4:])
    assert len(fault_server.state.received) == 4


def test_ctrl_c_stops_cleanly_and_keeps_what_was_measured(fault_server, tmp_path):
    fault_server.state.token_interval = 0.05
    lens = [2, 2, 300, 300, 300, 2]  # the last one arrives at 30 s: never sent
    path = tmp_path / "workload.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "".join(
        f"{30.0 if i == 5 else 0.0},10,{n}\n" for i, n in enumerate(lens)))
    out = tmp_path / "out"
    env = dict(os.environ, NO_COLOR="1")
    process = subprocess.Popen([sys.executable, "-m", "kvlab", "bench", "--url", fault_server.url, "-w", str(path),
                                "--arrival", "trace", "--out", str(out)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while len(fault_server.state.completed) < 2 or len(fault_server.state.received) < 5:
            assert time.monotonic() < deadline and process.poll() is None, process.communicate()
            time.sleep(0.05)
        time.sleep(0.3)  # the long answers are mid-stream
        process.send_signal(signal.SIGINT)
        _stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "Interrupted" in stderr
    rows = read_requests_csv(out / "requests.csv")
    assert [r["status"] for r in rows] == ["finished", "finished", "failed", "failed", "failed", "failed"]
    for row in rows[2:5]:
        assert row["error"].startswith("interrupted (Ctrl-C) after") and 0 < row["num_output_tokens"] < 300
    assert rows[5]["error"] == "not sent: interrupted (Ctrl-C)" and rows[5]["send_time"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] == "interrupted" and summary["num_finished"] == 2 and summary["num_failed"] == 4


def test_unreachable_url_stops_before_any_load(kvlab, tmp_path):
    result = kvlab("bench", "--url", f"http://127.0.0.1:{free_port()}", "-n", "3")
    assert result.exit_code == 2
    assert "cannot reach http://127.0.0.1:" in result.stderr and "Nothing was sent" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_server_that_is_not_openai_compatible_gets_no_load(kvlab, tmp_path):
    with FaultServer(FaultState(openai=False)) as server:
        result = kvlab("bench", "--url", server.url + "/v1", "-n", "3")
        assert result.exit_code == 2
        assert f"{server.url} is not an OpenAI-compatible server: GET /v1/models gave no OpenAI model list" \
            in result.stderr
        assert server.state.received == []


def test_foreign_metrics_are_named_and_the_run_proceeds(kvlab, tmp_path):
    with FaultServer(FaultState(metrics="foreign")) as server:
        out = tmp_path / "out"
        result = _bench(kvlab, server, _workload(tmp_path, [NORMAL] * 3), "--out", out, "--metrics-interval", "0.1")
        assert result.exit_code == 0, result.stderr
        assert "/metrics is not vLLM's (no vllm:num_requests_running" in result.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["num_finished"] == 3 and summary["preemptions"] is None
        names = {line.split(",")[1] for line in (out / "metrics.csv").read_text().splitlines()[1:]}
        assert names == {"http_requests_total"}  # what the server does publish is still recorded


def test_a_server_slow_to_answer_metrics_is_scraped_less_often(kvlab, tmp_path):
    # Each /metrics answer takes 0.2 s and the bench asks every 0.01 s: after each, it waits 4 x 0.2 s instead,
    # so scraping takes at most a fifth of the server's time (vLLM answers it on the loop that streams tokens).
    # A load of about 2.4 s then sees a scrape a second, not five: with the probe before the load, the scrape
    # that opens it and the one that closes it, at most 7 in all (asking back to back would make about 15).
    with FaultServer(FaultState(metrics="foreign", metrics_delay=0.2, token_interval=0.2)) as server:
        result = _bench(kvlab, server, _workload(tmp_path, [NORMAL] * 2), "--metrics-interval", "0.01")
        assert result.exit_code == 0, result.stderr
        times = server.state.metrics_times
        gaps = [round(b - a, 2) for a, b in zip(times, times[1:])]
        assert 4 <= len(times) <= 7, gaps
        assert max(gaps) >= 0.2 + 4 * 0.2 - 0.05, gaps  # the pause after a scrape inside the load


def test_compare_without_the_server_config_stops_before_any_load(kvlab, fault_server, tmp_path):
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL] * 3), "--compare")
    assert result.exit_code == 2
    assert "--compare needs the server's KV cache size" in result.stderr and "--num-gpu-blocks" in result.stderr
    assert fault_server.state.received == []


def test_bad_options_are_one_line_errors(kvlab, fault_server, tmp_path):
    for args, message in ((("--concurrency", "0"), "--concurrency 0 is out of range; valid: clients, a whole number "
                                                   "≥ 1"),
                          (("--timeout", "-1"), "--timeout -1 is out of range; valid: seconds, a finite number > 0"),
                          (("--prompt-format", "bytes"), "--prompt-format 'bytes' is not one of its values; valid: "
                                                         "auto, token-ids, text"),
                          # (trial 46: the simulation's options were ignored without --compare, --rate in a closed loop)
                          (("--cost", "bogus"), "--cost bogus applies only with --compare"),
                          (("--block-size", "16"), "--block-size 16 applies only with --compare"),
                          (("--num-gpu-blocks", "30"), "--num-gpu-blocks 30 applies only with --compare"),
                          (("--max-model-len", "512"), "--max-model-len 512 applies only with --compare"),
                          (("--model-config", "opt-13b"), "--model-config opt-13b applies only with --compare"),
                          (("--gpu", "h100"), "--gpu h100 applies only with --compare"),
                          (("--concurrency", "2", "--rate", "3"), "--rate 3 does not apply with --concurrency 2")):
        result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL]), *args)
        assert result.exit_code == 2 and message in result.stderr, result.stderr
    result = kvlab("bench", "--url", "127.0.0.1:8000")
    assert result.exit_code == 2 and "is not an http:// or https:// URL" in result.stderr
    result = kvlab("bench", "--url", fault_server.url, "--model", "gpt-9")
    assert result.exit_code == 2 and "--model 'gpt-9' is not served by" in result.stderr
    assert fault_server.state.received == []


def test_compare_with_a_given_configuration_writes_its_table_and_plots(kvlab, fault_server, tmp_path):
    """A server that publishes no configuration can still be compared when it is given; --cost goes through to
    the simulator."""
    from kvlab.vllm.compare import TINY_MODEL_CONFIG

    out = tmp_path / "out"
    given = ("--compare", "--block-size", "32", "--num-gpu-blocks", "24", "--max-model-len", "512",
             "--model-config", str(TINY_MODEL_CONFIG))
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL] * 4), *given, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    compare = result.json()["compare"]
    table = {row["figure"]: row for row in compare["table"]}
    assert table["requests finished"]["measured"] == table["requests finished"]["simulated"] == 4
    assert table["preemptions"]["measured"] is None  # no /metrics: nothing measured, nothing made up
    assert (compare["settings"]["num_gpu_blocks"], compare["settings"]["num_slots"]) == (24, 24 * 32)
    assert any("not calibrated for this server" in note for note in compare["notes"])
    assert all((out / name).exists() for name in ("compare.csv", "compare_latency.png", "compare_kv_cache_usage.png"))
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL]), *given, "--cost", "roofline", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["compare"]["settings"]["cost"] == "roofline"


def test_the_tables_keep_to_80_columns_and_a_compare_says_what_it_rejected(kvlab, fault_server, tmp_path,
                                                                            monkeypatch):
    """Trial 46: the tables were 120 columns wide whatever the terminal; --compare put 0 simulated beside 5
    measured without a word, titled the strategy `vllm` when it ran without prefix caching, and named the
    simulation's CSVs as if they were in --out rather than in --out/simulated."""
    from kvlab.vllm.compare import TINY_MODEL_CONFIG

    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "out"
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL, DROP, NORMAL, NORMAL]), "--compare", "--block-size",
                    "16", "--num-gpu-blocks", "2", "--max-model-len", "512", "--model-config", str(TINY_MODEL_CONFIG),
                    "--out", out)
    assert result.exit_code == 0, result.stderr
    assert max(len(line.rstrip()) for line in result.stdout.splitlines()) <= 80, result.stdout
    assert "…" not in result.stdout and "preemptions" in result.stdout and "e2e p99" in result.stdout
    words = " ".join(result.stdout.split())
    assert "Measured beside simulated (kvlab's `vllm+noprefix` strategy)" in words
    assert "the simulation rejected 3 of the 4 requests sent (3 larger than the whole KV cache)" in words
    assert "What did not finish (1 request):" in words  # (the failure's long line wrapped, not cut)
    assert "simulated/vllm-noprefix_requests.csv" in " ".join(result.stderr.split())
    assert (out / "simulated" / "vllm-noprefix_requests.csv").exists()


def test_a_short_answer_is_diagnosed_from_its_finish_reason(kvlab, fault_server, tmp_path):
    """Trial 49: a server's own cap (finish_reason "length") was reported as an end-of-sequence stop with advice
    to try --ignore-eos, and requests.csv did not say how each request ended."""
    fault_server.state.max_tokens_cap = 5
    out = tmp_path / "out"
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL, 3, NORMAL]), "--out", out)
    assert result.exit_code == 0, result.stderr
    words = " ".join(result.stdout.split())
    assert ("2 finished requests got fewer tokens than asked: 2 stopped at the server's own cap (finish_reason \"length\" "
            "before the max_tokens sent") in words
    assert "--ignore-eos will not help" in words and "try --ignore-eos" not in words
    rows = read_requests_csv(out / "requests.csv")
    assert [(r["num_output_tokens"], r["finish_reason"]) for r in rows] == [(5, "length"), (3, "length"), (5, "length")]
    assert json.loads((out / "summary.json").read_text())["short_finish_reasons"] == {"length": 2}

    fault_server.state.max_tokens_cap, fault_server.state.eos_after = None, 4
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL, 3]), "--json")
    assert result.exit_code == 0, result.stderr
    summary = result.json()
    assert [r["finish_reason"] for r in summary["requests"]] == ["stop", "length"]
    assert summary["short_finish_reasons"] == {"stop": 1}
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL, 3]))
    assert ("1 finished requests got fewer tokens than asked: 1 stopped at an end-of-sequence token or stop string "
            "(finish_reason \"stop\"): try --ignore-eos.") in " ".join(result.stdout.split())


def test_compare_simulates_the_output_lengths_the_server_returned(kvlab, fault_server, tmp_path):
    """Trial 49: with a server that stopped answers early, --compare simulated the max_tokens sent (3,499 tokens
    against 640 received), and its measured generation tokens were "–" without the server's counters."""
    from kvlab.vllm.compare import TINY_MODEL_CONFIG

    fault_server.state.max_tokens_cap = 5
    lens = [NORMAL, 3, 40, NORMAL]
    result = _bench(kvlab, fault_server, _workload(tmp_path, lens), "--compare", "--block-size", "32",
                    "--num-gpu-blocks", "24", "--max-model-len", "512", "--model-config", str(TINY_MODEL_CONFIG),
                    "--json")
    assert result.exit_code == 0, result.stderr
    compare = result.json()["compare"]
    table = {row["figure"]: row for row in compare["table"]}
    received = 5 + 3 + 5 + 5
    assert table["generation tokens"]["measured"] == table["generation tokens"]["simulated"] == received
    assert table["prompt tokens"]["measured"] == table["prompt tokens"]["simulated"] == 10 * len(lens)
    assert compare["output_lengths"] == ("the simulation gives each finished request the output length it "
                                         "received: 15 tokens for the 3 that got fewer than asked, not the 64 sent "
                                         "as max_tokens")
    fault_server.state.max_tokens_cap = None
    result = _bench(kvlab, fault_server, _workload(tmp_path, lens), "--compare", "--block-size", "32",
                    "--num-gpu-blocks", "24", "--max-model-len", "512", "--model-config", str(TINY_MODEL_CONFIG))
    assert result.exit_code == 0, result.stderr
    assert "the output length it received" not in result.stdout  # every answer as long as asked: nothing to say


def test_the_servers_usage_count_wins_over_counting_text_chunks(kvlab, fault_server, tmp_path):
    """Trial 49: the output length --compare simulates is the one received: usage.completion_tokens where the
    stream's chunks of text carried several tokens each (counted one a chunk), so the count is the server's."""
    fault_server.state.tokens_per_chunk = 3
    out = tmp_path / "out"
    result = _bench(kvlab, fault_server, _workload(tmp_path, [NORMAL, 7]), "--out", out)
    assert result.exit_code == 0, result.stderr
    rows = read_requests_csv(out / "requests.csv")
    assert [(r["num_output_tokens"], r["status"]) for r in rows] == [(NORMAL, "finished"), (7, "finished")]
    tokens = [json.loads(line) for line in (out / "token_times.jsonl").read_text().splitlines()]
    assert [t["num_tokens"] for t in tokens] == [[1, 1, 1, 9], [1, 1, 5]]  # 4 and 3 chunks; the rest in the last
    assert "fewer tokens than asked" not in result.stdout


def test_bounds_that_are_not_finite_are_refused_before_any_load(kvlab, fault_server, tmp_path):
    """trial 51, finding 3: --timeout inf and --time-limit 1e400 ran, with 'times out after inf s': the bench's bounds
    switched off (0 and nan were refused, in another style than run's)."""
    workload = _workload(tmp_path, [NORMAL])
    for args, line in ((("--timeout", "inf"), "--timeout inf is not a finite number; valid: seconds, a finite number "
                                              "> 0"),
                       (("--time-limit", "1e400"), "--time-limit inf is not a finite number; valid: seconds, a finite "
                                                   "number > 0"),
                       (("--metrics-interval", "nan"), "--metrics-interval nan is not a finite number"),
                       (("--timeout", "0"), "--timeout 0 is out of range; valid: seconds, a finite number > 0")):
        result = _bench(kvlab, fault_server, workload, *args)
        assert result.exit_code == 2 and line in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert fault_server.state.received == []


def test_a_port_that_takes_the_connection_without_http_is_said_so(kvlab):
    """trial 51, finding 4: a listener that closed the connection was reported as 'cannot reach ...: Server
    disconnected without sending a response.. Is the server running there?' (it was reached; a double period)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def close_each() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    try:
        result = kvlab("bench", "--url", f"http://127.0.0.1:{port}", "-n", "2")
    finally:
        listener.close()
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.stderr
    line = " ".join(result.stderr.split())
    assert line.startswith(f"error: http://127.0.0.1:{port} took the connection but gave no HTTP answer to GET "
                           "/v1/models (")
    assert line.endswith("): is an OpenAI-compatible server listening on that port? Nothing was sent.")
    assert "cannot reach" not in line and ".." not in line


def test_requests_that_end_the_same_way_are_one_line_of_the_report(kvlab, fault_server, tmp_path):
    """trial 51, finding 5: four requests that all timed out were listed as four lines '1 × no complete answer ...',
    one per token count (test_bench_parts.py holds the counting to ranges; here the report's line)."""
    result = _bench(kvlab, fault_server, _workload(tmp_path, [STALL, NORMAL, STALL, STALL]), "--timeout", "1")
    assert result.exit_code == 0, result.stderr
    words = " ".join(result.stdout.split())
    assert "What did not finish (3 requests): 3 × no complete answer within 1 s (--timeout): 2 of 9 tokens" in words
    assert words.count("no complete answer") == 1


def test_a_bench_where_no_request_finished_exits_1(kvlab, fault_server, tmp_path):
    """trial 51, finding 20: every request refused (HTTP 400 on a server without a tokenizer) or timed out, and the
    bench exited 0, as one that measured."""
    out = tmp_path / "out"
    result = _bench(kvlab, fault_server, _workload(tmp_path, [HTTP_500, HTTP_500, HTTP_429]), "--out", out)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "error: none of the 3 requests finished: nothing was measured" in " ".join(result.stderr.split())
    assert (out / "requests.csv").exists()  # (what was measured is kept all the same)
    assert _bench(kvlab, fault_server, _workload(tmp_path, [HTTP_500, NORMAL])).exit_code == 0


def test_prompts_too_long_for_the_servers_max_model_len_are_said_before_they_are_sent(kvlab, fault_server, tmp_path):
    """trial 51, finding 20: a 2,047-token prompt was sent to a server whose /v1/models said max_model_len 512, and
    refused there (HTTP 400), with nothing said before."""
    fault_server.state.max_model_len = 64
    path = tmp_path / "workload.csv"
    path.write_text("arrival_time,prompt_len,output_len\n0,10,12\n0.01,100,12\n0.02,64,12\n")
    result = _bench(kvlab, fault_server, path)
    words = " ".join(result.stderr.split())
    assert ("note: 2 of the 3 requests have prompts too long for the server's max_model_len 64 (the longest 100 "
            "tokens): it will refuse them (HTTP 400)") in words, words


def test_compares_simulation_options_are_checked_before_the_server_is(kvlab):
    """trial 51, finding 14: --compare --cost bogus (or a bad --block-size) was reported as an unreachable server
    first, unlike --timeout and the workload's options, which are checked before connecting."""
    url = f"http://127.0.0.1:{free_port()}"
    for args, line in ((("--cost", "bogus"), "error: unknown cost profile 'bogus'"),
                       (("--block-size", "0"), "error: --block-size 0 is out of range"),
                       (("--num-gpu-blocks", "1"), "error: --num-gpu-blocks 1 is out of range")):
        result = kvlab("bench", "--url", url, "-n", "2", "--compare", *args)
        assert result.exit_code == 2 and result.stderr.startswith(line), result.stderr
        assert "cannot reach" not in result.stderr


def test_a_password_in_the_url_is_printed_and_stored_as_stars(kvlab, fault_server, tmp_path):
    url = fault_server.url.replace("http://", "http://user:secret@") + "/v1"
    out = tmp_path / "out"
    result = kvlab("bench", "--url", url, "-w", _workload(tmp_path, [NORMAL, HTTP_500, DROP]), "--arrival", "trace",
                   "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "Server http://user:***@127.0.0.1:" in result.stdout + result.stderr
    assert "secret" not in result.stdout + result.stderr
    assert not any("secret" in path.read_text() for path in out.iterdir() if path.suffix != ".png")
    assert json.loads((out / "summary.json").read_text())["server"]["url"].startswith("http://user:***@127.0.0.1:")
    refused = kvlab("bench", "--url", f"http://user:secret@127.0.0.1:{free_port()}/v1", "-n", "3")
    assert refused.exit_code == 2 and "cannot reach http://user:***@127.0.0.1:" in refused.stderr
    assert "secret" not in refused.stderr


def test_answers_capped_to_the_servers_max_model_len_are_said_in_the_load_line(kvlab, fault_server, tmp_path):
    """Trial 56: the bench shortened answers to fit max_model_len (max_tokens = max_model_len - prompt) and said
    nothing: its 'mean output' differed from kvlab run's on the same requests."""
    fault_server.state.max_model_len = 64
    path = tmp_path / "workload.csv"
    path.write_text("arrival_time,prompt_len,output_len\n0,10,12\n0.01,40,40\n")
    result = _bench(kvlab, fault_server, path)
    words = " ".join(result.stderr.split())
    assert ("mean prompt 25 / output 18 tokens (1 answer capped to fit the server's max_model_len 64: max_tokens = "
            "max_model_len - prompt; uncapped, as kvlab run serves them, the mean output is 26)") in words, words
    path.write_text("arrival_time,prompt_len,output_len\n0,10,12\n0.01,20,12\n")
    assert "capped to fit" not in " ".join(_bench(kvlab, fault_server, path).stderr.split())
