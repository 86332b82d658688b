"""Trial 53's findings on what kvlab capacity, run and sweep say (fix53b): each a message fragment that the trial found
missing or wrong."""

from __future__ import annotations

from kvlab.sweep.session import format_duration


def test_the_time_estimate_counts_the_whole_trace_the_second_sample_runs(kvlab, tmp_path):
    # (trial 53, finding 7: -n 200 on azure-conv was estimated as two searches of 200 requests; the second is the
    # whole trace, 19,366, and the run took 40 times the estimate)
    r = kvlab("capacity", "--strategy", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--slo", "p99_ttft<2s",
              "--workload", "azure-conv", "-n", "200", "--workers", "1", "--cost", "vllm-h100", "--max-time", "0s",
              "--out", tmp_path / "cap")
    assert r.exit_code != 0
    assert "(the workload and a longer sample of 19,366 requests;" in r.stderr
    assert " of simulation on 1 worker, more than --max-time 0s" in r.stderr


def test_a_duration_over_the_limit_never_reads_as_within_it():
    assert format_duration(10.04, above=10) == "11 s"
    assert format_duration(10.04) == "10 s"


def test_a_runs_rate_on_a_trace_says_that_rate_rescales_the_whole_trace(kvlab):
    # (trial 53, finding 9: --rate 15 on azure-conv printed "arriving at 8.85 req/s on average" without saying why)
    r = kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "azure-conv", "--rate", "15",
              "-n", "50")
    assert r.exit_code == 0
    assert ("(the trace's own arrivals, rescaled so that the whole trace averages --rate 15; these 50 arrive at their "
            "own pace within it)") in " ".join(r.stdout.split())
    plain = kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5", "-n", "50")
    assert "averages --rate" not in plain.stdout  # (arrivals drawn at the rate: it is their mean)


def test_a_profile_set_for_a_gpu_from_published_figures_is_not_called_fitted():
    # (trial 53, finding 12: "no clock here is fitted on real runs on this GPU" above "paper-2023 (fitted on A100-40GB
    # for opt-13b)", the very setup)
    from kvlab.report.setup import fitted_to

    assert fitted_to("paper-2023").startswith("paper-2023 (set for opt-13b on A100-40GB, not fitted on real runs): ")
    assert fitted_to("vllm-h100").startswith("vllm-h100 (fitted on H100-SXM): ")
    assert fitted_to("roofline").startswith("roofline (stated, not fitted; any GPU): ")


def test_run_and_sweep_say_their_req_s_is_finished_over_the_makespan(kvlab, tmp_path):
    # (trial 53, finding 8: run's 4.68 req/s at 5.33 arriving, and sweep's 0.666 at rate 1, read as what the GPU serves)
    run = " ".join(kvlab("run", "vllm", "-n", "20", "--rate", "2").stdout.split())
    assert "req/s, out tok/s: finished requests (output tokens) ÷ the run's makespan" in run
    assert "kvlab capacity measures the served rate over a window instead" in run
    sweep = kvlab("sweep", "--strategy", "vllm", "--rate", "1", "-n", "20", "--workers", "1", "--out", tmp_path / "s")
    words = " ".join(sweep.stdout.split())
    assert sweep.exit_code == 0, sweep.stderr
    assert "req/s, tok/s: finished requests (output tokens) ÷ the run's makespan" in words
    assert "the store's window_served_rps" in words


def test_the_labs_breaking_point_without_an_answer_carries_capacitys_reason_and_the_two_samples():
    # (trial 53, finding 2: /api/rates?num_requests=100 gave vllm-paper "none (3.25 ?)" without the reason, and
    # kvlab capacity answered 2.5 on its second sample; since trial 54, finding 4, the lab searches both samples and
    # answers 2.5 there too (tests/test_lab_rates_cli.py): 50 requests, too few on both, are no answer, with the reason)
    from kvlab.sweep.capacity import rate_text
    from kvlab.web.rates import RateLab, RateSetup

    lab = RateLab()
    setup = RateSetup(model="opt-13b", gpu="a100-40gb", workload="paper-sharegpt", num_requests=50, seed=0,
                      block_size=16, cost="roofline")
    try:
        found = lab.breaking_points(setup, ("vllm-paper",))
    finally:
        lab.runner.pool.close()
    (line,) = found["systems"]
    # (the text shows the rate to 3 significant digits, rounded down: 3.125 as 3.12)
    assert line["capacity_rps"] is None and line["capacity_text"] == f"none ({rate_text(line['uncertified_rps'])} ?)"
    assert line["uncertified_reason"].startswith(f"the run at {line['uncertified_rps']:g} req/s was too short to "
                                                 "load the engine")
    assert "on these requests and on a second, longer sample" in found["samples_note"]


def test_a_sweep_on_a_file_shorter_than_the_time_probe_runs(kvlab, tmp_path):
    """Trial 53b: the --max-time estimate's probe asked a file with its own arrival times for 200 requests, so a sweep
    or capacity search on a 40-request file was refused ("has 40 requests ..., not 200") whatever -n was given."""
    trace = tmp_path / "t40.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n" + "".join(f"{i * 0.25},{100 + i},50\n" for i in range(40)))
    r = kvlab("sweep", "--strategy", "vllm", "-w", trace, "-n", "20", "--rate", "1,2", "--workers", "1",
              "--out", tmp_path / "s")
    assert r.exit_code == 0, r.stderr
    assert "not 200" not in r.stderr
