"""fix62: trial 61's leftovers (findings 8 and 10): run, race and capacity say kvlab's 0.9 against the version's
0.92 beside their pool; capacity's cheapest line names every tied entry, the answer's clock first; --max-time bounds
--replicas auto and the xPyD comparison; fit's refusal keeps tensor parallelism within a node; no "….", and the
fleet table's columns with one number of decimals."""

from __future__ import annotations

import re

import pytest

CLAUSE = "gpu_memory_utilization 0.9, kvlab's default, where vLLM 0.32.0 defaults to 0.92"


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_run_and_race_say_kvlabs_utilization_beside_their_pool_only_where_it_is_not_the_versions(kvlab):
    # (finding 8: `size` said it, `run`/`race` simulated at 0.9 and said nothing)
    run = kvlab("run", "vllm", "-n", "30")
    assert run.exit_code == 0, run.stderr
    assert f"(864 blocks of 16, one of them vLLM's null block for paged memory; {CLAUSE})" in _flat(run.stdout)
    race = kvlab("race", "vllm", "orca-max", "-n", "30")
    assert race.exit_code == 0 and f"paged memory; {CLAUSE})" in _flat(race.stdout)
    # given (even at kvlab's 0.9), a version that starts at 0.9 too, or a pool kvlab did not estimate: nothing
    for args in (("--gpu-memory-utilization", "0.9"), ("--gpu-memory-utilization", "0.8"), ("--vllm-version", "0.15.1"),
                 ("--available-kv-gib", "12"), ("--num-gpu-blocks", "500")):
        r = kvlab("run", "vllm", "-n", "30", *args)
        assert r.exit_code == 0 and "kvlab's default, where" not in r.stdout, args


def test_size_and_fit_keep_their_note_in_the_same_words(kvlab):
    # (one text: kvlab.report.setup.utilization_clause, which `size`'s and `fit`'s note now wrap)
    note = f"at {CLAUSE}: pass --gpu-memory-utilization 0.92 for what it starts with unless told"
    assert note in _flat(kvlab("size", "opt-13b", "--gpu", "a100-40gb").stdout)
    assert note in _flat(kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm").stdout)


def test_capacity_says_it_in_its_setup_lines_kv_cache_and_ends_that_line_once(kvlab, tmp_path):
    args = ("capacity", "--strategy", "vllm", "-n", "50", "--workers", "1", "--cost", "roofline")
    r = kvlab(*args, "--out", tmp_path / "a")
    assert r.exit_code == 0, r.stderr
    text = _flat(r.stdout)
    assert f"Setup: opt-13b on 1× A100-40GB; KV cache: 864 blocks of 16 tokens ({CLAUSE}); engine:" in text
    # (finding 10c: the roofline's shortened source ended "3 ms per iteration …." in the setup line)
    assert "3 ms per iteration …" in text and "…." not in text
    stated = kvlab(*args, "--gpu-memory-utilization", "0.9", "--out", tmp_path / "b")
    assert stated.exit_code == 0 and "KV cache: 864 blocks of 16 tokens; engine:" in _flat(stated.stdout)


def test_capacity_replicas_auto_says_it_too(kvlab, tmp_path):
    r = kvlab("capacity", "--strategy", "vllm", "--replicas", "auto", "--rate", "2", "-n", "60", "--cost", "roofline",
              "--router", "round-robin", "--workers", "1", "--out", tmp_path / "r")
    assert r.exit_code == 0, r.stderr
    assert f"KV cache: 864 blocks of 16 tokens ({CLAUSE})" in _flat(r.stdout)


def test_a_sentence_gets_one_stop():
    from kvlab.report.text import sentence

    assert sentence("3 ms per iteration …") == "3 ms per iteration …"
    assert sentence("done.") == "done."
    assert sentence("done") == "done."


def _entry(router: str, cost: str, usd: float) -> dict:
    return {"strategy": "vllm", "router": router, "cost": cost, "serving_cost": {"usd_per_hour": usd}}


def test_the_cheapest_line_names_every_tied_entry_led_by_the_answers_clock():
    # (finding 10b: "Cheapest under the target" named 3 of 6 entries tied at $6.48/h, led by the roofline, where the
    # answer was led by vllm-h100)
    from kvlab.cli.capacity import cheapest_text

    entries = [_entry(router, cost, 6.48) for cost in ("roofline", "vidur-h100", "vllm-h100")
               for router in ("round-robin", "least-requests")]
    assert cheapest_text(entries, "vllm-h100", True) == (
        "6 tied at $6.48/h: vllm behind round-robin under vllm-h100, vllm behind least-requests under vllm-h100, "
        "vllm behind round-robin under roofline, vllm behind least-requests under roofline, vllm behind round-robin "
        "under vidur-h100, vllm behind least-requests under vidur-h100")
    # prices apart: the three cheapest, each with its price; a tie at the third price named whole
    apart = [_entry("round-robin", "a", 9.72), _entry("round-robin", "b", 3.24), _entry("least-requests", "b", 6.48),
             _entry("round-robin", "c", 12.96)]
    assert cheapest_text(apart, "b", True) == ("vllm behind round-robin under b $3.24/h; vllm behind least-requests "
                                               "under b $6.48/h; vllm behind round-robin under a $9.72/h")
    tied_last = [_entry("round-robin", "b", 3.24), _entry("round-robin", "a", 6.48), _entry("least-requests", "a", 6.48),
                 _entry("round-robin", "c", 6.48)]
    assert cheapest_text(tied_last, "b", False).endswith("3 tied at $6.48/h: vllm behind round-robin, vllm behind "
                                                         "least-requests, vllm behind round-robin")


@pytest.mark.parametrize("mode", [(), ("--prefill-replicas", "auto")])
def test_replicas_auto_and_the_xpyd_comparison_refuse_a_search_beyond_max_time(kvlab, tmp_path, mode):
    # (they ran whatever --max-time said; the rate search refused in these words)
    out = tmp_path / "cap"
    r = kvlab("capacity", "--strategy", "vllm", "--replicas", "auto", *mode, "--rate", "2", "-n", "200",
              "--router", "round-robin", "--cost", "roofline", "--workers", "1", "--max-time", "0s", "--out", out)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert re.fullmatch(r"error: .+: about .+ of simulation on 1 worker, more than --max-time 0s; add --yes to run it "
                        r"anyway, or sweep fewer points", r.stderr.strip()), r.stderr
    what = "fewest-replicas search" if not mode else "a comparison of fleets on 2 samples (200 and 400 requests"
    assert what in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("model, piped", [("llama-3.1-405b", "--tensor-parallel-size 8 --pipeline-parallel-size 9 "
                                                             "(72 x T4)"),
                                          ("deepseek-v3", "--tensor-parallel-size 2 --pipeline-parallel-size 31 "
                                                          "(62 x T4)")])
def test_fits_refusal_proposes_tensor_parallelism_within_a_node(kvlab, model, piped):
    # (fit proposed "--tensor-parallel-size 128 on this GPU" where `kvlab size` keeps TP within a node's 8 GPUs)
    r = kvlab("fit", model, "--gpu", "t4")
    text = _flat(r.stderr)
    assert r.exit_code == 2, text
    assert not re.search(r"--tensor-parallel-size (1[6-9]|[2-9][0-9]|1[0-9][0-9])\b", text), text
    assert (f"with pipeline stages too, tensor parallelism within a node's 8 GPUs: {piped} hold it; or lower "
            "--max-model-len or pick a larger GPU") in text


def test_the_fleet_tables_columns_have_one_number_of_decimals_each(kvlab):
    # (finding 10d: TPOT "9.22" above "9.2")
    r = kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "azure-conv", "--replicas",
              "2", "--rate", "20", "-n", "200", "--cost", "vllm-h100")
    assert r.exit_code == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if re.fullmatch(r"\s*[01]\s+\d+\s.*%\s*", line)]
    assert len(rows) == 2, r.stdout
    for column in (2, 3, 4):  # req/s, TTFT p99 ms, TPOT p50 ms
        decimals = {len(row[column].partition(".")[2]) for row in rows}
        assert len(decimals) == 1, [row[column] for row in rows]


def test_same_decimals_gives_the_smallest_value_three_significant_digits():
    from kvlab.report.text import same_decimals

    assert same_decimals([9.22, 9.6]) == ["9.22", "9.60"]
    assert same_decimals([136.0, 4.5, None]) == ["136.00", "4.50", "–"]
    assert same_decimals([1234.4, 140.0]) == ["1,234", "140"]
    assert same_decimals([0.0, 0.25]) == ["0.000", "0.250"]
