"""A trace too short for two samples (issue 31): each capacity answer is searched on the workload and a longer one (on a
trace, the whole trace), but a trace that keeps its own arrival times cannot be stretched. Without -n the sample is at most half the trace, so that
both fit (the second is then the whole trace), and the answer says why it is shorter; with an -n whose double the
trace does not hold, the answer is the one sample, saying so with the -n that would give two; never a traceback.
(llmservingsim-sharegpt: the bundled trace of 300 requests, shorter than the default 1,000.)"""

from __future__ import annotations

from kvlab.service import capacity, replicas
from kvlab.sweep.grid import parse_cli_args

TRACE = ["--workload", "llmservingsim-sharegpt", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--cost",
         "roofline"]
REPLICAS = ["capacity", "--replicas", "auto", "--rate", "2", "--router", "round-robin", "--slo", "p99_ttft<2s", *TRACE]


def test_the_default_sample_is_half_a_short_trace_so_that_the_second_fits():
    assert capacity.two_sample_length(1000, None) == 1000  # (a workload drawn as long as asked)
    assert capacity.two_sample_length(1000, 2000) == 1000
    assert capacity.two_sample_length(1000, 1999) == 999
    assert capacity.two_sample_length(1000, 300) == 150
    rate, searches = replicas.replica_searches(parse_cli_args(["--rate", "2", "--router", "round-robin", *TRACE]), [])
    (first, second) = searches
    assert (first.factor, first.num_requests, second.factor, second.num_requests) == (1, 150, 2, 300)
    assert first.second is second and first.no_second is None
    assert first.length_note == ("llmservingsim-sharegpt has 300 requests with their own arrival times: the sample is "
                                 "150 (not 1,000) so that the second sample, the whole trace, is at least twice it")


def test_a_given_sample_too_long_to_double_is_answered_on_one_and_names_the_n_that_would_do(kvlab, tmp_path):
    r = kvlab(*REPLICAS, "-n", "200", "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    (entry,) = r.json()["fewest_replicas"]
    note = ("no second sample: llmservingsim-sharegpt has 300 requests with their own arrival times, and twice this "
            "sample's 200 would need 400; -n 150 or fewer gives two samples (or a trace of 400 requests or more)")
    assert entry["samples"] == {"lengths": [200], "replicas": [entry["replicas"]], "agree": None,
                                "answered_by": 200, "other_runs": [], "note": note}
    runs = {run["replicas"]: run for run in entry["runs"]}
    assert entry["replicas"] is not None and runs[entry["replicas"]]["held"]
    r = kvlab(*REPLICAS, "-n", "200", "--out", tmp_path)
    assert r.exit_code == 0, r.stderr
    assert f"one sample: on 200 requests {entry['replicas']} ({note})" in " ".join(r.stdout.split())


def test_a_sample_longer_than_the_trace_is_one_line(kvlab, tmp_path):
    r = kvlab(*REPLICAS, "-n", "400", "--out", tmp_path)
    assert r.exit_code != 0 and "Traceback" not in r.stderr + r.stdout
    assert r.stderr.strip().splitlines() == [
        "error: llmservingsim-sharegpt has 300 requests with their own arrival times, not 400; ask for fewer, or for "
        "--arrival poisson or gamma to draw its lengths as often as needed"]


def test_the_rate_search_on_a_short_trace_takes_half_of_it_or_says_why_one_sample(kvlab, tmp_path):
    common = ["capacity", "--strategy", "vllm", "--slo", "p99_ttft<2s", "--rate", "2", *TRACE, "--workers", "1"]
    r = kvlab(*common, "--out", tmp_path / "default", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    (c,) = data["capacities"]
    assert c["samples"]["lengths"] == [150, 300] and c["samples"]["answer_rps"] == min(c["samples"]["capacities"])
    # (1,000: the engine's 256 seats, twice over in the window, are fewer than `kvlab run`'s default)
    assert data["length_notes"] == ["llmservingsim-sharegpt has 300 requests with their own arrival times: the sample "
                                    "is 150 (not 1,000) so that the second sample, the whole trace, is at least twice it"]
    r = kvlab(*common, "-n", "200", "--out", tmp_path / "given", "--json")
    assert r.exit_code == 0, r.stderr
    (c,) = r.json()["capacities"]
    assert c["samples"]["lengths"] == [200] and c["samples"]["note"].startswith(
        "no second sample: llmservingsim-sharegpt has 300 requests with their own arrival times, and twice this "
        "sample's 200 would need 400; -n 150 or fewer gives two samples")


def test_a_rate_too_short_a_run_could_not_load_the_engine_at_is_no_answer(kvlab, tmp_path):
    """30 requests at tens of requests a second never fill opt-13b's seats: the search's top rate is no capacity,
    and the answer says so with the sample that would load the engine (a user's trial read 42 req/s as one)."""
    args = ("capacity", "--strategy", "vllm", "--cost", "roofline", "--slo", "p99_ttft<2s", "-n", "30",
            "--workers", "1", "--out", tmp_path)
    r = kvlab(*args, "--json")
    assert r.exit_code == 0, r.stderr
    (answer,) = r.json()["capacities"]
    assert (answer["certified"], answer["too_short"]) == (False, True)
    r = kvlab(*args)
    said = " ".join(r.stdout.split())
    assert "vllm: no answer: the run at" in said and "too few to load the engine" in said
    assert "-n 1,000 puts twice its seats in the window" in said
    assert "req/s, the lower of two samples" not in said and "none (42 ?)" in said


def test_the_advice_for_a_longer_run_on_a_file_shorter_than_it_draws_poisson_arrivals():
    # (trial 53, finding 6: "-n 1,000" on an inference-perf file of 200 requests was then refused by -n's own check)
    assert capacity.longer_run_advice("ip.yaml", None, 1000) == "-n 1,000"
    assert capacity.longer_run_advice("ip.yaml", 2000, 1000) == "-n 1,000"
    said = capacity.longer_run_advice("ip.yaml", 200, 1000)
    assert said.startswith("--arrival poisson -n 1,000") and "ip.yaml holds only 200 requests" in said
    assert said.endswith("with their own arrival times, 800 too few)")


IP_YAML = """data:
  type: shared_prefix
  shared_prefix: {{num_groups: 2, num_prompts_per_group: 5, system_prompt_len: 1000, question_len: 100, output_len: 100}}
load:
  type: constant
  stages: [{{rate: 1, duration: {duration}}}]
"""


def test_a_file_too_short_for_a_window_is_advised_what_it_can_follow(kvlab, tmp_path):
    """Trial 54, finding 1: a 10-request inference-perf file was advised "-n 13", which -n's own check then refused
    ("has 10"). The advice is one the file can follow: its lengths at Poisson arrivals, saying how short it falls."""
    path = tmp_path / "ten.yaml"
    path.write_text(IP_YAML.format(duration=10))
    args = ("capacity", "--workload", path, "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--cost", "roofline",
            "--slo", "p99_ttft<2s", "--strategy", "vllm", "--workers", "1", "--out", tmp_path / "out")
    advice = ("valid: --arrival poisson -n 13 (its lengths at Poisson arrivals: ten.yaml holds only 10 requests with "
              "their own arrival times, 3 too few)")
    for given, what in (((), "the default sample of 5 requests"), (("-n", "10"), "--num-requests 10")):
        r = kvlab(*args, *given)
        assert r.exit_code != 0 and "Traceback" not in r.stderr + r.stdout
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"error: {what}: the measured window") and line.endswith(advice), line
    r = kvlab(*args, "--arrival", "poisson", "-n", "13", "--json")  # (the advice, followed)
    assert r.exit_code == 0, r.stderr
    assert r.json()["capacities"][0]["samples"]["lengths"][0] == 13


def test_the_seats_advice_on_a_short_file_is_their_need_not_runs_floor():
    # (trial 54, finding 1: "--arrival poisson -n 1,000" on a 100-request file whose engine's 256 seats need 640)
    assert capacity.seats_run_length(256, None) == 1000  # (hundreds, at least `kvlab run`'s 1,000)
    assert capacity.seats_run_length(256, 5000) == 1000
    assert capacity.seats_run_length(256, 100) == capacity.steady_requests(256) == 640  # 2 x 256 / 0.8
    assert capacity.seats_run_length(600, 1000) == 1500
    assert capacity.seats_run_length(600, 1499) == 1500


def test_a_first_sample_too_short_to_show_an_overload_is_said_so_not_blamed_on_the_trace(kvlab, tmp_path):
    """Trial 54, finding 2: on a 400-request inference-perf file (every request alike), the first sample of 200 held
    every rate up to 512 req/s (none failed) and the whole trace 30; the answer blamed "the trace's beginning", which
    is like the whole of it. It says now what is true: the first sample is too short for a steady state."""
    path = tmp_path / "four.yaml"
    path.write_text(IP_YAML.format(duration=400).replace("system_prompt_len: 1000", "system_prompt_len: 200"))
    r = kvlab("capacity", "--workload", path, "--model", "opt-13b", "--gpu", "a100-40gb", "--cost", "roofline",
              "--slo", "p99_ttft<2s", "--strategy", "vllm", "--workers", "1", "--out", tmp_path / "out")
    assert r.exit_code == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert "the first sample's 200 requests are too few to reach a steady state" in said
    assert "the trace's beginning is not like the whole of it" not in said
