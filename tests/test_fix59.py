"""Fix 59: trial 58's findings still open (vLLM's printed figure and run's token slots under two labels, the
"if saturated" range, TTFT's unit, absurd log figures, a model named by its path, wide lines, bench's refusal)."""

from __future__ import annotations

import html

import pytest


def _flat(text: str) -> str:
    return " ".join(text.split())


# --- 1. "GPU KV cache size" (vLLM's figure) in size, fit and the lab; "token slots" (blocks x tokens) in run ------


def test_size_labels_vllms_figure_apart_from_runs_token_slots(kvlab):
    size = kvlab("size", "mistral-7b-v0.1", "--gpu", "h100-sxm")
    assert size.exit_code == 0, size.stderr
    text = _flat(size.stdout)
    assert "Token slots" not in size.stdout
    assert "GPU KV cache size 732,432 tokens vLLM's startup figure, whole 32,768-token requests' worth" in text, text
    assert "not the 458,128 token slots (28,633 blocks x 16 tokens) kvlab run counts" in text
    run = kvlab("run", "vllm", "--model", "mistral-7b-v0.1", "--gpu", "h100-sxm", "-n", "20")
    assert "KV cache 458,128 token slots" in _flat(run.stdout)


def test_size_row_where_the_figures_agree(kvlab):
    size = kvlab("size", "llama-3.1-8b", "--gpu", "h100-sxm")
    text = _flat(size.stdout)
    assert "GPU KV cache size 442,720 tokens vLLM's startup figure: int(27,670 / 8,192 x 131,072) = 27,670 blocks x 16" \
        in text, text
    assert "kvlab run counts" not in text


def test_fit_names_vllms_figure(kvlab):
    fit = kvlab("fit", "mistral-7b-v0.1", "--gpu", "h100-sxm")
    text = _flat(fit.stdout)
    assert "(GPU KV cache size 732,432 tokens, 22.35x)" in text and "token slots" not in text, text


def test_lab_calculator_relates_the_two_counts():
    from kvlab.web.calculator import answer

    r = answer(model="mistral-7b-v0.1", gpu="h100-sxm", concurrency=1, context_len=1024, gpu_memory_utilization=0.9)
    assert r["num_tokens"] == 732_432 and r["num_slots"] == 458_128
    assert "not the 458,128 token slots" in r["num_tokens_text"]
    same = answer(model="llama-3.1-8b", gpu="h100-sxm", concurrency=1, context_len=1024, gpu_memory_utilization=0.9)
    assert same["num_tokens"] == same["num_slots"] == 442_720


def test_export_line_carries_runs_relation(tmp_path):
    from kvlab.config import resolve
    from kvlab.report.setup import printed_size_text
    from kvlab.web.export import write_race_html
    from kvlab.workload import load_workload

    config = resolve(model="mistral-7b-v0.1", gpu="h100-sxm")
    workload = load_workload("paper-sharegpt", num_requests=10, rate=4.0, seed=2)
    text = write_race_html(tmp_path / "race.html", config, workload, ["vllm"]).read_text()
    said = printed_size_text(config.sizing, config.cache.num_slots, config.cache.block_size)
    assert said and 'GPU KV cache size: 732,432 tokens' in said
    assert html.escape(said) in text


# --- 2. the real engine's req/s range only where the run is overloaded ------------------------------------------


def test_band_gives_no_rate_range_to_a_run_that_keeps_up(kvlab):
    run = kvlab("run", "vllm", "--model", "llama-2-7b", "--gpu", "h100-sxm", "-n", "200")
    text = _flat(run.stdout)
    assert "where the real engine would be" in text and "TTFT p50 18.6–38.4 ms" in text, text
    assert "if saturated" not in text and "req/s if" not in text
    assert "no req/s range: one holds only for an overloaded engine (below its capacity it serves what arrives" in text


def test_band_gives_an_overloaded_run_its_rate_range(kvlab):
    run = kvlab("run", "vllm", "--model", "llama-2-7b", "--gpu", "h100-sxm", "-n", "1000", "--rate", "100")
    text = _flat(run.stdout)
    assert "vllm is overloaded at the offered rate" in text
    assert "TTFT p50 4,446–9,195 ms" in text, text  # (whole, not 4.45e+03)
    assert "overloaded, it served 21.8–29.7 req/s over this run." in text


# --- 3. TTFT in ms in every run's table -------------------------------------------------------------------------


def test_ttft_column_is_in_ms_whatever_its_size(kvlab):
    """A run whose TTFT p50 is seconds (5.99 s) reads in ms like one whose is 25 ms: two runs' tables compare."""
    slow = kvlab("run", "vllm", "--model", "llama-2-7b", "--gpu", "h100-sxm", "-n", "1000", "--rate", "100")
    fast = kvlab("run", "vllm", "--model", "llama-2-7b", "--gpu", "h100-sxm", "-n", "200")
    for run in (slow, fast):
        header = next(line for line in run.stdout.splitlines() if line.startswith("strategy"))
        assert "p50 ms" in header and "p50 s " not in header, header
    row = next(line for line in slow.stdout.splitlines() if line.startswith("vllm "))
    assert row.split()[6] == "5,994", row  # (TTFT p50 in ms: 5.99 s before)


# --- 4. absurd log figures, a config.json's model named as size names it, --arrival burst --rate ---------------


@pytest.mark.parametrize("line", ["GPU KV cache size: 99999999999999999999999 tokens",
                                  "GPU KV cache size: 9,007,199,254,740,992 tokens",
                                  "INFO 10-06 15:57:53 [loggers.py:123] num_gpu_blocks is: 99999999999999999999"])
def test_vllm_log_refuses_an_absurd_kv_figure(kvlab, tmp_path, line):
    log = tmp_path / "absurd.log"
    log.write_text(line + "\n")
    r = kvlab("vllm", "log", log)
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    message = _flat(r.stderr)
    assert "which vLLM never prints: kvlab reads at most 9,007,199,254,740,991 (2^53 - 1)" in message, message
    assert "more than any GPU holds" in message


def test_vllm_log_reads_the_largest_figure_it_allows(kvlab, tmp_path):
    log = tmp_path / "big.log"
    log.write_text("GPU KV cache size: 9,007,199,254,740,976 tokens\n")
    r = kvlab("vllm", "log", log, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["kv_cache_tokens"] == 9_007_199_254_740_976


def test_run_names_a_config_json_as_size_does(kvlab):
    from pathlib import Path

    path = str(Path(__file__).parent / "data" / "sizing_configs" / "granite-4.0-h-1b.json")
    size = kvlab("size", path, "--gpu", "h200")
    assert size.stdout.startswith("granite-4.0-h-1b on H200")
    run = kvlab("run", "vllm", "--model", path, "--gpu", "h200", "-n", "10")
    assert run.exit_code == 0, run.stderr
    assert run.stdout.startswith("granite-4.0-h-1b on H200: KV cache") and path not in run.stdout


def test_burst_with_a_rate_says_what_auto_does_for_a_stand_in(kvlab):
    r = kvlab("run", "vllm", "--arrival", "burst", "--rate", "5", "-n", "20")
    message = _flat(r.stderr)
    assert r.exit_code == 2 and "--rate 5 contradicts --arrival burst" in message
    assert "use --arrival auto for arrivals at the rate (a trace's own times rescaled to it, else Poisson arrivals)" \
        in message, message


# --- 6. bench's refusal of a huge workload: its memory, not a simulator's time ----------------------------------


def test_a_memory_only_refusal_quotes_no_simulator_time():
    from kvlab.validate import TooMuchWork
    from kvlab.workload import load_workload

    with pytest.raises(TooMuchWork) as caught:
        load_workload("paper-sharegpt", num_requests=100_000_000)
    message = str(caught.value)
    assert "workload paper-sharegpt means about 100,000,000 requests" in message
    assert "GiB of memory to hold them, beyond the limit of 4 GiB" in message and "pass --yes" in message
    assert "minutes" not in message and "request-runs" not in message, message


def test_a_simulation_refusal_still_quotes_its_time(kvlab):
    r = kvlab("run", "vllm", "--rate", "4", "--duration", "1e9")
    assert r.exit_code == 2
    assert "~3 days and ~7,629.4 GiB of memory, beyond the limit of 1,000,000 request-runs" in _flat(r.stderr)


# --- 5. fig18b's lines within 80 columns -------------------------------------------------------------------------


def test_fig18b_lines_fit_80_columns(kvlab, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = kvlab("paper", "fig18b", "--block-sizes", "1,2,4,8,16,32,64,128,256", "--duration", "20", "--workers", "1",
              "--out", tmp_path)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert any(line.startswith("  kvlab's best: ") for line in lines)
    assert any(line.startswith("  paper's (§7.2): 16, 32, 64, 128: ") for line in lines)
    assert not any(line.startswith("Note:") for line in lines) and any(line.startswith("note: ") for line in lines)


# --- trial 59 -----------------------------------------------------------------------------------------------------


def test_race_names_every_strategy_that_served_nothing_and_not_as_keeping_up(kvlab):
    """Trial 59, finding 1: a strategy that rejected every request was said to "keep up", and only one of two that
    served nothing was named."""
    r = kvlab("race", "orca-max", "static+max", "vllm", "--num-gpu-blocks", "100", "-n", "200", "--rate", "30")
    text = _flat(r.stdout)
    assert r.exit_code == 0, r.stderr
    assert "vllm served the most: 0.397 req/s; orca-max and static+max served nothing (200 and 200 requests " \
           "rejected)." in text, text
    assert "keep up:" not in text and "keeps up:" not in text


def test_verdict_says_why_only_from_figures_that_differ():
    """Trial 59, finding 7: "0.0% of its KV memory held tokens against 0.0%" explained nothing."""
    from kvlab.report.tables import verdict

    def summary(name, rps, token, batch):
        return {"name": name, "throughput_rps": rps, "num_finished": 100, "num_rejected": 0,
                "memory_shares": {"token": token}, "mean_batch_size": batch}

    text = verdict([summary("a", 4.19, 0.01, 2.4), summary("b", 4.14, 0.02, 2.1)])
    assert "a served the most: 4.19 req/s, 1.01× b (4.14 req/s). Why: it batched 2.4 requests per iteration " \
           "against 2.1;" in text, text
    assert "0.0%" not in text
    alike = verdict([summary("a", 6.0, 50.0, 2.4), summary("b", 3.0, 50.0, 2.4)])
    assert "2.0× b" in alike and "memory does not explain the difference" in alike and "Why:" not in alike
    both = verdict([summary("a", 6.0, 90.0, 30.0), summary("b", 1.0, 10.0, 3.0)])
    assert "Why: 90.0% of its KV memory held tokens against 10.0%, so it batched 30.0 requests per iteration " \
           "against 3.0;" in both


@pytest.mark.parametrize("sides", [("--prefill-replicas", "1", "--decode-replicas", "1"), ("--decode-replicas", "2")])
def test_capacity_replicas_auto_with_fixed_sides_says_auto(kvlab, sides):
    """Trial 59, finding 5: the refusal quoted --replicas 2 where the user gave auto."""
    r = kvlab("capacity", "--replicas", "auto", "--rate", "3", *sides, "-n", "100")
    message = _flat(r.stderr)
    assert r.exit_code == 2 and f"--replicas auto with {' '.join(sides)}: a disaggregated fleet counts its replicas " \
        "by side" in message, message
    assert "--replicas 2 " not in message and "Traceback" not in r.stderr


def test_one_draft_token_is_singular():
    """Trial 59, finding 14: "1 draft tokens per step"."""
    from kvlab.report.setup import setup_lines

    spec = {"method": "mtp", "num_speculative_tokens": 1, "acceptance": 0.7, "expected_tokens_per_step": 1.7}
    text = " ".join(setup_lines({"speculative": spec}))
    assert "mtp, 1 draft token per step, acceptance 0.7" in text, text
    assert "3 draft tokens per step" in " ".join(setup_lines({"speculative": {**spec, "num_speculative_tokens": 3}}))


def test_vllm_log_table_draws_plain_rules(kvlab):
    """Trial 59, finding 14: `kvlab vllm log` drew a heavy box (┏━┳) where every other command draws plain rules."""
    from pathlib import Path

    log = Path(__file__).parent / "data" / "startup_logs" / "qwen3-8b-a100-40gb-0.9.2.log"
    r = kvlab("vllm", "log", log)
    assert r.exit_code == 0, r.stderr
    assert "┏" not in r.stdout and "━" not in r.stdout and "─" in r.stdout
