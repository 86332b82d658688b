"""kvlab calibrate on bench folders that kvlab's own simulator wrote under a known profile: the fit recovers it.

The files follow docs/bench.md (requests.csv, token_times.jsonl, summary.json), written by stepping a simulation
and streaming each request's tokens at the end of the iteration that produced them, as a server would.
"""

from __future__ import annotations

import csv
import json
import re
import tomllib
from pathlib import Path

import pytest

from kvlab.config import resolve
from kvlab.cost.profiles import write_profile
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy

# Both sides of the max set the time in some iterations (3 ms of fixed step against 0.4 ms per token: batches of
# more than 7 tokens are bound by per-token work), and a request spends 10 ms outside the engine.
TRUE = {"weights_read_s": 0.003, "context_token_s": 2e-7, "token_s": 4e-4, "attention_pair_s": 0.0,
        "overhead_s": 0.001, "seq_overhead_s": 1e-4, "prefill_token_overhead_s": 2e-5, "request_latency_s": 0.01}
FITTED = ("weights_read_s", "context_token_s", "token_s", "overhead_s", "seq_overhead_s", "prefill_token_overhead_s")
REPO = Path(__file__).resolve().parents[1]
TINY = "src/kvlab/vllm/tiny_llama.json"


def true_profile(tmp_path, **constants) -> str:
    doc = {"name": "truth", "kind": "absolute", "source": "the test's known constants",
           "constants": {**TRUE, **constants}}
    return str(write_profile(doc, tmp_path / "truth.toml"))


def write_bench(out, cost: str, *, rate: float, num_requests: int = 150, arrival: str = "poisson", seed: int = 0,
                num_gpu_blocks: int = 4096) -> dict:
    """Simulate the workload under ``cost`` step by step and write what kvlab bench would have measured."""
    from kvlab import service
    from kvlab.config.resolve import workload_config
    from kvlab.cost.latency import delayed
    config = resolve(model=str(REPO / TINY), gpu="a100-40gb", num_gpu_blocks=num_gpu_blocks,
                     max_num_seqs=64, max_model_len=2048, cost=cost).engine
    workload = service.load(workload_config(workload="paper-alpaca", rate=rate, arrival=arrival,
                                            num_requests=num_requests, seed=seed))
    # The engine sees each request request_latency_s late; the client's clock is the engine's.
    sim = Simulation(parse_strategy("vllm"), config, delayed(workload, config.cost.request_latency_s),
                     max_iterations=1)
    prompt = {r.request_id: r.prompt_len for r in workload.requests}
    output_len = {r.request_id: r.output_len for r in workload.requests}
    computed, emitted, chunks = dict.fromkeys(prompt, 0), dict.fromkeys(prompt, 0), {rid: [] for rid in prompt}
    waiting = []  # what a /metrics scrape after each iteration would read
    steps = []  # what vLLM's --enable-logging-iteration-details would log: (context reqs, tokens, generation ...)
    ends = []  # when each step ended
    while (start := sim.now, out_ := sim.step())[1] is not None:
        waiting.append((sim.now, sim.counters_now()["num_waiting"]))
        for rid in out_.preempted_req_ids:
            computed[rid] = 0
        context = [n for rid, n in out_.num_scheduled_tokens.items() if emitted[rid] == 0]
        generation = [n for rid, n in out_.num_scheduled_tokens.items() if emitted[rid] > 0]
        steps.append((len(context), sum(context), len(generation), sum(generation), sim.now - start))
        ends.append(sim.now)
        for rid, n in out_.num_scheduled_tokens.items():
            computed[rid] += n
            if computed[rid] >= prompt[rid] + emitted[rid]:  # its last token computed: one new token streams
                emitted[rid] += 1
                chunks[rid].append(sim.now)
        held = sum(-(-computed[rid] // config.cache.block_size) for rid, n in emitted.items() if n < output_len[rid])
        steps[-1] += (held / (num_gpu_blocks - 1),)  # the KV cache usage after the step, as vLLM reports it
    out.mkdir(parents=True, exist_ok=True)
    with (out / "requests.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["request_id", "arrival_time", "prompt_len", "requested_output_tokens", "num_output_tokens",
                         "status", "error", "send_time", "first_token_time", "finish_time", "ttft", "tpot",
                         "e2e_latency"])
        for r in workload.requests:
            times = chunks[r.request_id]
            writer.writerow([r.request_id, r.arrival_time, r.prompt_len, r.output_len, len(times), "finished", "",
                             r.arrival_time, times[0], times[-1], times[0] - r.arrival_time, "", ""])
    with (out / "token_times.jsonl").open("w") as f:
        for rid, times in chunks.items():
            f.write(json.dumps({"request_id": rid, "times": times, "num_tokens": [1] * len(times)}) + "\n")
    with (out / "metrics.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", "name", "value"])
        writer.writerows((t, "vllm:num_requests_waiting", n) for t, n in waiting)
    (out / "summary.json").write_text(json.dumps({"workload": {"rate": rate}, "server": {
        "block_size": config.cache.block_size, "num_gpu_blocks": num_gpu_blocks}}))
    assert all(len(chunks[r.request_id]) == r.output_len for r in workload.requests)
    return {"config": config, "workload": workload, "steps": steps, "ends": ends, "chunks": chunks}


def write_server_log(out, bench: dict, *, outside_s: float, first_step: int = 7) -> Path:
    """The log vLLM would have written for that bench with --enable-logging-iteration-details (each step's
    elapsed time its duration less ``outside_s``, the part of an iteration outside the timed forward pass), after
    ``first_step`` steps of an earlier bench; and the scrapes of /metrics that number the bench's steps and time
    its tokens (metrics.csv)."""
    lines = ["INFO 12-01 11:00:00 [api_server.py:1] vLLM API server version 0.32.0"]
    lines += [f"(APIServer pid=1) INFO 12-01 11:00:01 [loggers.py:199] Engine 000: Iteration({i}): 0 context "
              "requests, 0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: "
              "999.00 ms, CPU KV cache usage: 1.0%" for i in range(first_step)]  # not this bench's
    for i, (num_ctx, ctx_tokens, num_gen, gen_tokens, duration, usage) in enumerate(bench["steps"], first_step):
        lines.append(f"(APIServer pid=1) INFO 12-01 11:00:02 [loggers.py:199] Engine 000: Iteration({i}): {num_ctx} "
                     f"context requests, {ctx_tokens} context tokens, {num_gen} generation requests, {gen_tokens} "
                     f"generation tokens, iteration elapsed time: {(duration - outside_s) * 1e3:.3f} ms, CPU KV "
                     f"cache usage: {usage * 100:.3f}%")
    path = out / "vllm-server.log"
    path.write_text("\n".join(lines) + "\n")
    # Scrapes every 10 steps: the step counter and the inter-token latencies of the tokens streamed by then.
    ends = bench["ends"]
    gaps = [(b, b - a) for times in bench["chunks"].values() for a, b in zip(times, times[1:])]
    scrapes = [*range(0, len(bench["steps"]), 10), len(bench["steps"])]
    with (out / "metrics.csv").open("a", newline="") as f:
        writer = csv.writer(f)
        for k, num_steps in enumerate(scrapes):
            until = ends[num_steps - 1] if num_steps else -1.0
            done = [gap for end, gap in gaps if end <= until]
            tokens = first_step + sum(step[1] + step[3] for step in bench["steps"][:num_steps])
            writer.writerows([(k, "vllm:iteration_tokens_total_count", first_step + num_steps),
                              (k, "vllm:iteration_tokens_total_sum", tokens),
                              (k, "vllm:inter_token_latency_seconds_sum", 5.0 + sum(done)),
                              (k, "vllm:inter_token_latency_seconds_count", 300 + len(done))])
    return path


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    write_bench(tmp / "run", true_profile(tmp), rate=40.0)
    return tmp / "run"


def test_calibrate_recovers_the_constants_the_data_was_made_with(kvlab, bench_dir, tmp_path):
    out = tmp_path / "fitted.toml"
    r = kvlab("calibrate", bench_dir, "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    fitted = tomllib.loads(out.read_text())
    assert fitted["kind"] == "absolute"
    for name in FITTED:
        assert fitted["constants"][name] == pytest.approx(TRUE[name], rel=0.03), name
        sigma = fitted["fit"]["sigma"][name]
        assert 0 <= sigma < 0.05 * TRUE[name]  # the simulator's clock is exact: tight uncertainties
    assert fitted["fit"]["rms_residual_s"] < 1e-4
    # Read off first tokens, with half an iteration's uncertainty about when each request reached the engine.
    assert fitted["constants"]["request_latency_s"] == pytest.approx(TRUE["request_latency_s"], rel=0.15)
    assert fitted["constants"]["attention_pair_s"] == 0.0  # not fitted
    assert r.json()["weakly_determined"] == []


@pytest.mark.parametrize("name", ["fitted.toml", "fitted.json"])
def test_calibrate_writes_over_its_own_profile_and_refuses_a_hand_written_one(kvlab, bench_dir, tmp_path, name):
    out = tmp_path / name
    assert kvlab("calibrate", bench_dir, "--out", out).exit_code == 0
    again = kvlab("calibrate", bench_dir, "--out", out)  # (a profile kvlab fitted: its source says so)
    assert again.exit_code == 0, again.stderr
    hand = tmp_path / f"hand{out.suffix}"
    text = out.read_text().replace("kvlab calibrate", "by hand")
    hand.write_text(text)
    refused = kvlab("calibrate", bench_dir, "--out", hand)
    assert refused.exit_code == 2 and "already exists and is not a file kvlab wrote" in refused.stderr
    assert hand.read_text() == text


def test_a_calibrated_profile_reproduces_the_run_it_came_from(kvlab, bench_dir, tmp_path):
    """--cost FILE takes calibrate's output; the same workload under it gives the measured latencies."""
    out = tmp_path / "fitted.json"
    assert kvlab("calibrate", bench_dir, "--out", out).exit_code == 0
    args = ("run", "--model", REPO / TINY, "--num-gpu-blocks", "4096", "--max-num-seqs", "64", "--max-model-len",
            "2048", "-w", "paper-alpaca", "--rate", "40", "-n", "150", "--json")
    fitted = kvlab(*args, "--cost", out).json()["strategies"][0]
    truth = kvlab(*args, "--cost", true_profile(tmp_path)).json()["strategies"][0]
    for key in ("ttft_s", "tpot_s"):
        assert fitted[key]["p50"] == pytest.approx(truth[key]["p50"], rel=0.03), key
    assert fitted["throughput_rps"] == pytest.approx(truth["throughput_rps"], rel=0.02)


def test_calibrate_reads_the_servers_own_account_of_its_steps(kvlab, tmp_path):
    """--server-log: each step's contents, KV cache usage and forward-pass time as the server logged them, the
    rest of an iteration from vLLM's inter-token latency."""
    bench = write_bench(tmp_path / "run", true_profile(tmp_path), rate=40.0)
    log = write_server_log(tmp_path / "run", bench, outside_s=0.0008)
    out = tmp_path / "fitted.toml"
    r = kvlab("calibrate", tmp_path / "run", "--server-log", log, "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    fitted = tomllib.loads(out.read_text())
    for name in ("weights_read_s", "token_s", "seq_overhead_s", "prefill_token_overhead_s"):
        assert fitted["constants"][name] == pytest.approx(TRUE[name], rel=0.03), name
    # The context is read off the blocks held, to half a block per request.
    assert fitted["constants"]["context_token_s"] == pytest.approx(TRUE["context_token_s"], rel=0.1)
    # The time outside the forward pass comes back as per-iteration overhead (to the log's 1 µs resolution).
    assert fitted["constants"]["overhead_s"] == pytest.approx(TRUE["overhead_s"], abs=2e-5)
    assert fitted["fit"]["num_iterations"] == len(bench["steps"])  # the bench's steps, not the earlier bench's
    assert "the server's log" in fitted["source"]
    assert fitted["constants"]["request_latency_s"] == pytest.approx(TRUE["request_latency_s"], rel=0.15)


def test_a_server_log_without_step_lines_is_refused(kvlab, bench_dir, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO 12-01 11:00:00 [api_server.py:1] vLLM API server version 0.32.0\n")
    r = kvlab("calibrate", bench_dir, "--server-log", log, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and "--enable-logging-iteration-details" in r.stderr
    assert not (tmp_path / "p.toml").exists()


def test_an_out_file_in_a_missing_folder_is_refused_before_the_fit(kvlab, bench_dir, tmp_path):
    r = kvlab("calibrate", bench_dir, "--out", tmp_path / "nowhere" / "p.toml")
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        f"error: --out {tmp_path / 'nowhere' / 'p.toml'}: folder {tmp_path / 'nowhere'} does not exist; valid: a file "
        "in an existing, writable folder"]


def test_a_constant_the_data_cannot_identify_is_refused_by_name(kvlab, tmp_path):
    """All requests at once: their prompts run together before any decodes, so no timed iteration holds a
    prefill, and the per-prefill-token cost cannot be read from this data."""
    write_bench(tmp_path / "burst", true_profile(tmp_path), rate=None, arrival="burst", num_requests=40)
    r = kvlab("calibrate", tmp_path / "burst", "--out", tmp_path / "p.toml")
    assert r.exit_code == 2
    assert "cannot identify prefill_token_overhead_s" in r.stderr
    assert "requests arrive while others decode" in r.stderr  # the data that would
    assert "--fit weights_read_s,context_token_s,token_s,overhead_s,seq_overhead_s,request_latency_s" in r.stderr
    assert not (tmp_path / "p.toml").exists()  # nothing written


def test_a_max_side_that_never_sets_the_time_is_refused(kvlab, tmp_path):
    """Per-token work never outweighs the fixed step at these batch sizes: token_s cannot be read."""
    write_bench(tmp_path / "slow", true_profile(tmp_path, token_s=1e-6), rate=40.0, num_requests=60)
    r = kvlab("calibrate", tmp_path / "slow", "--out", tmp_path / "p.toml")
    assert r.exit_code == 2
    assert "cannot identify token_s" in r.stderr and "near or above capacity" in r.stderr


def test_too_little_data_is_refused(kvlab, tmp_path):
    write_bench(tmp_path / "few", true_profile(tmp_path), rate=1.0, num_requests=3)
    rows = [json.loads(line) for line in (tmp_path / "few/token_times.jsonl").read_text().splitlines()]
    (tmp_path / "few/token_times.jsonl").write_text("".join(  # a client stopped after five tokens each
        json.dumps({**row, "times": row["times"][:5], "num_tokens": row["num_tokens"][:5]}) + "\n" for row in rows))
    r = kvlab("calibrate", tmp_path / "few", "--out", tmp_path / "p.toml")
    assert r.exit_code == 2
    assert "timed iterations" in r.stderr and "needs at least" in r.stderr
    assert not (tmp_path / "p.toml").exists()


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "is not a folder"),
    (lambda d: d.mkdir(), "has no requests.csv"),
])
def test_a_folder_that_is_not_a_bench_is_refused(kvlab, tmp_path, make, message):
    make(tmp_path / "x")
    r = kvlab("calibrate", tmp_path / "x", "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and message in r.stderr


def test_the_log_of_another_server_is_refused(kvlab, tmp_path):
    """The bench's scrapes number its steps; a log that holds none of them is not its server's."""
    bench = write_bench(tmp_path / "run", true_profile(tmp_path), rate=40.0, num_requests=20)
    log = write_server_log(tmp_path / "run", bench, outside_s=0.0)
    other = tmp_path / "other.log"
    other.write_text(log.read_text().replace("Iteration(", "Iteration(9"))  # steps 90, 91, ...: not the bench's
    r = kvlab("calibrate", tmp_path / "run", "--server-log", other, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and "give the log of the server that bench ran against" in r.stderr
    assert not (tmp_path / "p.toml").exists()


def test_the_log_of_another_server_run_with_the_same_step_numbers_is_refused(kvlab, tmp_path):
    """Trial 56: the log of a server started later (its steps numbered from 0 again) was taken for the bench's, its
    steps matched by number alone; what they scheduled does not add up to the tokens the bench's server scraped."""
    bench = write_bench(tmp_path / "run", true_profile(tmp_path), rate=40.0, num_requests=20)
    log = write_server_log(tmp_path / "run", bench, outside_s=0.0)
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    summary["client"] = {"started_at": "2026-12-01 10:58:00+00:00"}
    (tmp_path / "run/summary.json").write_text(json.dumps(summary))
    other = tmp_path / "other.log"  # another run: the same step numbers, each step's prompt twice as long
    other.write_text(re.sub(r"(\d+) context tokens", lambda m: f"{2 * int(m.group(1))} context tokens",
                            log.read_text()).replace("12-01 11:00:02", "12-01 14:30:00"))
    r = kvlab("calibrate", tmp_path / "run", "--server-log", other, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "steps 7 to 289, logged 12-01 14:30:00, scheduled" in r.stderr and "the bench started 2026-12-01 10:58:00" in r.stderr
    assert "the log is another server run's" in r.stderr
    assert not (tmp_path / "p.toml").exists()
    assert kvlab("calibrate", tmp_path / "run", "--server-log", log, "--out", tmp_path / "p.toml").exit_code == 0


@pytest.mark.parametrize(("args", "message"), [
    (("--iterations", "50"), "--iterations 50 is for a fit on measured runs: give it with --runs FILE"),
    (("--start", "roofline"), "--start roofline is for a fit on measured runs"),
    (("--model", "bogus"), "--model: unknown model 'bogus'"),
])
def test_a_bench_folder_fit_refuses_what_it_would_ignore_or_write_wrongly(kvlab, bench_dir, tmp_path, args, message):
    """Trial 46: --iterations 50 (help: 1 to 20, with --runs) and --model bogus were accepted for a bench-folder
    fit; the second wrote model = "bogus" into the profile, and every later run warned "fitted for bogus"."""
    r = kvlab("calibrate", bench_dir, "--out", tmp_path / "p.toml", *args)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "p.toml").exists()


def test_a_bench_folder_fit_writes_the_model_as_kvlab_names_it(kvlab, bench_dir, tmp_path):
    out = tmp_path / "p.toml"
    assert kvlab("calibrate", bench_dir, "--out", out, "--model", "OPT-13B").exit_code == 0
    assert tomllib.loads(out.read_text())["model"] == "opt-13b"


@pytest.mark.parametrize(("name", "text", "message"), [
    ("summary.json", "", "summary.json is empty; valid: the JSON object kvlab bench writes"),
    ("summary.json", '{"server": {"block_size"', "summary.json is not valid JSON"),
    ("summary.json", "[1, 2]", "summary.json holds a JSON list; valid: the JSON object kvlab bench writes"),
    ("requests.csv", "request_id,arrival_time,prompt_len,status,send_time,first_token_time,finish_time\n0,0.0",
     "requests.csv line 2 has no 'prompt_len' cell (the file is cut short?)"),
    ("requests.csv", "request_id,arrival_time,prompt_len,status,send_time,first_token_time,finish_time\n"
                     "0,0.0,forty,finished,0,1,2\n", "requests.csv line 2: prompt_len = 'forty' is not a whole number"),
    ("metrics.csv", "time,name,value\n0.0,vllm:num_requests_waiting", "metrics.csv line 2 is not a scrape"),
])
def test_a_bench_file_empty_cut_short_or_of_the_wrong_shape_is_refused_by_name(kvlab, bench_dir, tmp_path, name, text,
                                                                               message):
    """Trial 56: an empty summary.json crashed calibrate with a JSONDecodeError traceback."""
    import shutil

    shutil.copytree(bench_dir, tmp_path / "run")
    (tmp_path / "run" / name).write_text(text)
    r = kvlab("calibrate", tmp_path / "run", "--out", tmp_path / "p.toml", "--fit", "context_token_s,overhead_s")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ") and message in r.stderr and str(tmp_path / "run" / name) in r.stderr
    assert not (tmp_path / "p.toml").exists()


def test_one_line_says_how_well_the_fit_explains_the_iterations_and_warns_of_a_poor_one(kvlab, bench_dir, tmp_path):
    """Trial 56: profiles with R² 0.1-0.2 were written with warnings constant by constant only; no line said the fit
    as a whole explains the data poorly (its medians held, its p99 TTFT was 7x off)."""
    import random
    import shutil

    good = kvlab("calibrate", bench_dir, "--out", tmp_path / "good.toml")
    assert good.exit_code == 0, good.stderr
    line = next(x for x in good.stdout.splitlines() if x.startswith("Fit: "))
    assert "explains 100% of the variation in the" in line and "(R² 1.000)" in line
    assert "poor fit" not in good.stdout + good.stderr
    # The same bench on a machine that pauses: each chunk reaches the client up to 20 ms late, at random.
    shutil.copytree(bench_dir, tmp_path / "noisy")
    rng = random.Random(1)
    rows = [json.loads(line) for line in (tmp_path / "noisy/token_times.jsonl").read_text().splitlines()]
    for row in rows:
        late = 0.0
        for k, t in enumerate(row["times"]):
            late += rng.expovariate(1 / 0.01) if rng.random() < 0.3 else 0.0
            row["times"][k] = t + late
    (tmp_path / "noisy/token_times.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    poor = kvlab("calibrate", tmp_path / "noisy", "--out", tmp_path / "poor.toml", "--fit",
                 "context_token_s,overhead_s,seq_overhead_s", "--json")
    assert poor.exit_code == 0, poor.stderr  # (written: a poor fit may still predict medians)
    quality = json.loads(poor.stdout)["fit_quality"]
    assert quality["summary"].startswith("Fit: the cost model explains")
    assert quality["poor"].startswith("a poor fit (R² below 0.5 or a median residual above 20%)")
    assert "do not trust its p90/p99 predictions" in quality["poor"] and "--server-log" in quality["poor"]
    assert (tmp_path / "poor.toml").exists()


def _in_milliseconds(source: Path, out: Path, summary: bool) -> None:
    """A copy of a bench folder with every time of requests.csv and token_times.jsonl x 1000 (trial 56)."""
    import shutil

    shutil.copytree(source, out)
    with (out / "requests.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in ("arrival_time", "send_time", "first_token_time", "finish_time"):
            row[column] = str(float(row[column]) * 1000)
    with (out / "requests.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [json.loads(line) for line in (out / "token_times.jsonl").read_text().splitlines()]
    (out / "token_times.jsonl").write_text("".join(
        json.dumps({**row, "times": [t * 1000 for t in row["times"]]}) + "\n" for row in lines))
    if summary:
        (out / "summary.json").write_text(json.dumps({**json.loads((source / "summary.json").read_text()),
                                                      "makespan_s": float(rows[-1]["finish_time"]) / 1000}))


@pytest.mark.parametrize(("summary", "message"), [
    (True, "requests.csv: send_time to finish_time span"),
    (False, "token_times.jsonl: the median gap per token between a request's chunks ('times') is"),
])
def test_a_bench_in_milliseconds_is_refused_naming_the_field_and_the_unit(kvlab, tmp_path, summary, message):
    """Trial 56: a bench folder converted to ms was fitted (iterations of 2.05e+04 ms), and the only refusal, of one
    constant over 60 s, named the output file and not the input's unit."""
    bench = tmp_path / "run"
    write_bench(bench, true_profile(tmp_path, weights_read_s=0.02, token_s=1e-3), rate=10.0, num_requests=30)
    _in_milliseconds(bench, tmp_path / "ms", summary)
    r = kvlab("calibrate", tmp_path / "ms", "--out", tmp_path / "p.toml", "--fit", "context_token_s,overhead_s")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: {tmp_path / 'ms'}/") and message in r.stderr
    assert "the times are not in seconds (milliseconds?); valid: seconds since the bench started" in r.stderr
    assert not (tmp_path / "p.toml").exists()


def test_a_missing_column_points_at_the_docs_that_exist(kvlab, bench_dir, tmp_path):
    """Trial 56: the message cited CONTRACTS.md, which is not in the repository."""
    import shutil

    shutil.copytree(bench_dir, tmp_path / "run")
    text = (tmp_path / "run/requests.csv").read_text()
    (tmp_path / "run/requests.csv").write_text(text.replace("first_token_time", "first_token", 1))
    r = kvlab("calibrate", tmp_path / "run", "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and "lacks the column 'first_token_time'" in r.stderr and "docs/bench.md" in r.stderr
    assert (REPO / "docs/bench.md").is_file() and "CONTRACTS" not in r.stderr


def test_the_suggested_fit_is_one_the_data_identifies(kvlab, tmp_path):
    """Trial 56: following the first refusal's --fit (token_s left out) led to a second refusal (weights_read_s:
    without the per-token side it is one more constant per iteration, beside overhead_s). The suggestion is now
    tried first, and following it fits."""
    write_bench(tmp_path / "slow", true_profile(tmp_path, token_s=1e-6), rate=40.0, num_requests=60)
    r = kvlab("calibrate", tmp_path / "slow", "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and "cannot identify token_s" in r.stderr
    assert "(without it this data does not identify weights_read_s either)" in r.stderr
    suggested = r.stderr.split("Or leave it out: --fit ")[1].split()[0]
    assert "weights_read_s" not in suggested and "token_s," not in suggested.replace("context_token_s", "")
    followed = kvlab("calibrate", tmp_path / "slow", "--out", tmp_path / "p.toml", "--fit", suggested)
    assert followed.exit_code == 0, followed.stderr
    # (the hints of a weak constant hold for the data they are printed for: not "any iterations")
    assert "any iterations" not in followed.stdout and "whose requests finish" not in followed.stdout


@pytest.mark.parametrize("fit", ["", " , "])
def test_a_fit_that_names_no_constant_is_refused(kvlab, bench_dir, tmp_path, fit):
    """Trial 56: --fit "" fitted every constant, as if no --fit were given."""
    r = kvlab("calibrate", bench_dir, "--out", tmp_path / "p.toml", "--fit", fit)
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        f"error: --fit {fit!r} names no constant; valid: one or more of weights_read_s, context_token_s, token_s, "
        "overhead_s, seq_overhead_s, prefill_token_overhead_s, request_latency_s, comma-separated (overhead_s among "
        "them), or no --fit for all"]
    assert not (tmp_path / "p.toml").exists()


def test_a_run_under_a_calibrated_profile_says_what_it_was_fitted_to(kvlab, bench_dir, tmp_path):
    """Trial 56: a profile calibrated on a real server's bench was said to be fitted on no real run at all."""
    out = tmp_path / "fitted.toml"
    assert kvlab("calibrate", bench_dir, "--out", out).exit_code == 0
    r = kvlab("run", "vllm", "-n", "20", "--cost", out)
    words = " ".join((r.stdout + r.stderr).split())
    assert r.exit_code == 0 and "none were used to fit it" not in words
    assert ("its error against real serving runs is not measured (it was fitted to a real engine's iterations, not "
            f"to its latencies; kvlab bench --compare --cost {out} measures them)") in words, words
