"""Measured runs as published (kvlab/cost/measured.py) and the profile fitted across them (kvlab/cost/fit.py)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvlab.cost import fit as F
from kvlab.cost.measured import read_runs, run_from_dict
from kvlab.errors import KvlabError


def _trainval() -> Path:
    """../shared/data/real-vllm/trainval.json beside the repository (benchmarks/real_vllm.py finds it the same way)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("real_vllm", Path(__file__).parents[1] / "benchmarks/real_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.default_runs()


TRAINVAL = _trainval()

RUN = {
    "id": "tiny", "model": "Qwen/Qwen2.5-0.5B-Instruct", "hardware": "H100", "tp": 1, "precision": "FP16",
    "total_kv_blocks": 2000, "max_num_seqs": 16, "max_num_batched_tokens": 512, "max_model_len": 1024,
    "workload": {"num_unique_system_prompts": 2, "num_users_per_system_prompt": 3, "system_prompt_len": 64,
                 "question_len": 100, "output_len": 20, "enable_multi_turn_chat": True, "load_type": "constant",
                 "stages": [{"rate": 20.0, "duration": 1}, {"rate": 40.0, "duration": 1}]},
    "actual": {group: {"e2e_mean": 120.0, "e2e_p90": 140.0, "e2e_p99": 150.0, "ttft_mean": 12.0,
                       "ttft_p90": 15.0, "ttft_p99": "0.02 s", "itl_mean": 5.684}
               for group in ("summary", "stage0", "stage1")},
}


def _with(path: str, value):
    raw = copy.deepcopy(RUN)
    *head, last = path.split(".")
    node = raw
    for key in head:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return raw


def test_a_published_run_reads_with_its_units():
    run = run_from_dict(RUN, "runs.json, run 0")
    assert run.measured("summary", "e2e_mean") == pytest.approx(0.120)
    assert run.measured("summary", "ttft_p99") == pytest.approx(0.020)
    assert run.groups == ("stage0", "stage1")
    assert run.workload.num_requests == 60 and run.workload.prompt_len == 64 + 100 + 37


@pytest.mark.parametrize(("path", "value", "message"), [
    ("tp", None, r"run 'tiny'\): missing field 'tp'"),
    ("actual.summary.itl_mean", None, r"missing field 'actual.summary.itl_mean'"),
    ("actual.summary.e2e_mean", "120 fortnights", r"actual.summary.e2e_mean = '120 fortnights': unit not understood"),
    ("actual.summary.e2e_mean", -3, r"must be a positive, finite duration"),
    ("actual.summary.itl_mean", -0.5, r"actual.summary.itl_mean = -0.5 must be a positive, finite duration"),
    # Trial 52: a prefill-only run (output_len 1, its ITL 0) was refused for its ITL; the fit cannot use it at all
    ("workload.output_len", 1, r"workload output_len 1: a prefill-only run \(one output token\) has no inter-token "
                               r"latency, and kvlab's fit cannot use it at all, its E2E and TTFT included"),
    # Trial 52: float() reads '12_0' as 120; a file's number is digits
    ("actual.summary.e2e_mean", "12_0 ms", r"e2e_mean = '12_0 ms': the number is not written in digits; valid"),
    ("cpu_offload", "lmcache", r"cpu_offload 'lmcache': kvlab replays vLLM's native CPU tier only"),
    ("precision", "INT4-AWQ", r"precision 'INT4-AWQ' is not one kvlab prices"),
    ("workload.load_type", "poisson", r"load type 'poisson' is not supported"),
    ("max_num_seqs", 2.5, r"max_num_seqs = 2.5; valid: a whole number"),
    # Trial 50: every metric in seconds, read as milliseconds, was fitted (20 s, no word)
    ("actual.summary.ttft_mean", 0.0578, r"actual.summary: ttft_mean = 0.0578 is below what any served request "
                                         r"takes \(1 ms\); valid: milliseconds"),
    ("actual.summary.itl_mean", "20 µs", r"actual.summary: itl_mean = '20 µs' \(0.02 ms\) is below what any served"),
    ("actual.summary.ttft_p90", "1 s", r"actual.summary: ttft_p90 \('1 s'\) is above ttft_p99"),
    ("actual.summary.ttft_mean", "0.5 s", r"actual.summary: ttft_mean \('0.5 s'\) is above e2e_mean"),
    # Trial 51: an ITL above the E2E, an E2E x1000 (2 x (12 + 20 x 5.684) ms allowed), the seconds example fixed
    ("actual.stage1.itl_mean", 130.0, r"actual.stage1: itl_mean \(130.0\) is above e2e_mean \(120.0\); valid: metrics "
                                      r"of one set of requests, where the gap between two tokens is part of"),
    ("actual.stage0.e2e_mean", 120000.0, r"actual.stage0: e2e_mean \(120000.0\) is more than 2 x \(ttft_mean \+ "
                                         r"output_len 20 x itl_mean\) = 251.4 ms, longer than any request"),
    ("actual.summary.ttft_mean", 0.138, r"ttft_mean = 0.138 is below .*unit: 0.138 seconds is '0.138 s'\)$"),
])
def test_a_bad_run_is_one_line_naming_the_run_and_the_field(path, value, message):
    with pytest.raises(KvlabError, match=message):
        run_from_dict(_with(path, value), "runs.json, run 0")


def test_a_run_kvlab_cannot_price_is_named(tmp_path):
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": [_with("model", "org/NoSuchModel-7B")]}))
    (run,) = read_runs(file)
    with pytest.raises(KvlabError, match=r"run 'tiny': model 'org/NoSuchModel-7B' is not in kvlab's catalogue"):
        F.prepare(run)
    fp8 = _with("precision", "FP8")
    with pytest.raises(KvlabError, match=r"precision FP8 but the catalogue's qwen2.5-0.5b-instruct stores weights"):
        F.prepare(run_from_dict(fp8, "x"))


def test_an_iteration_is_its_features_times_theta_and_requests_sum_the_iterations_they_span():
    prepared = F.prepare(run_from_dict(RUN, "x"))
    constants = {**F.START, "sampler_logit_s": 1e-10}  # (the sampler: each sequence's work over the vocabulary)
    replay = F.replay(prepared, constants)
    theta = F.theta_of(constants)
    np.testing.assert_allclose(replay.phi @ theta[:-1], replay.durations, rtol=1e-12)
    # The linear prediction of each fitted mean is the replay's own value at the constants it was replayed under.
    predicted = replay.predicted()
    for group, metric, row, _ in replay.equations():
        assert row @ theta == pytest.approx(predicted[group][metric], rel=1e-9)


def test_an_fp8_models_compute_bound_iteration_is_its_features_times_theta():
    # Scout FP8 at TP 2, a few long uncached prompts in chunks of 2,048: prefill iterations on the compute side, where
    # the attention's FLOPs run at the bf16 rate beside the matmuls' FP8 (the features once priced them at half that).
    raw = copy.deepcopy(RUN)
    raw.update(model="RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", tp=2, precision="FP8", total_kv_blocks=10000,
               max_num_batched_tokens=2048, max_model_len=4096)
    raw["workload"].update(num_unique_system_prompts=2, num_users_per_system_prompt=1, system_prompt_len=1500,
                           question_len=1000, output_len=5, enable_multi_turn_chat=False, stages=[{"rate": 2.0, "duration": 1}])
    raw["actual"] = {group: {**raw["actual"][group], "itl_mean": 27.0} for group in ("summary", "stage0")}
    prepared = F.prepare(run_from_dict(raw, "x"))
    assert prepared.pair_flops_s * 989.4e12 == pytest.approx(4 * 48 * 40 / 2 * 128)  # (bf16: H100's dense peak)
    constants = dict(F.START)
    replay = F.replay(prepared, constants)
    assert replay.phi[:, 2].any()  # (some iterations compute-bound)
    np.testing.assert_allclose(replay.phi @ F.theta_of(constants)[:-1], replay.durations, rtol=1e-12)


def test_a_screened_terms_column_prices_as_the_constant_it_copies_and_its_equations_are_the_replays():
    # benchmarks/real_vllm.py --screen: a candidate column beside θ's. A copy of the per-iteration overhead's column,
    # priced at c, is the overhead raised by c; and the screen's equations are Replay.equations' with it.
    import importlib.util

    spec = importlib.util.spec_from_file_location("real_vllm", Path(__file__).parents[1] / "benchmarks/real_vllm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    replay = F.replay(F.prepare(run_from_dict(RUN, "x")), dict(F.START))
    assert replay.fields is not None and len(replay.fields[0]) == len(replay.durations)
    theta, c = F.theta_of(F.START), 2e-4
    raised = theta.copy()
    raised[F.CONSTANTS.index("overhead_s")] += c
    plain, screened = bench._screen_rows(replay, None), bench._screen_rows(replay, replay.phi[:, 3])
    for without, with_term in zip(plain, screened):
        np.testing.assert_allclose(with_term @ np.append(theta, c), without @ raised, rtol=1e-12)
    expected = [(row, measured) for _, _, row, measured in replay.equations()]
    for (row, measured), (want, want_measured) in zip(bench._screen_equations(replay, *plain), expected, strict=True):
        np.testing.assert_allclose(row, want, rtol=1e-12)
        assert measured == want_measured


def test_with_the_lags_spread_each_requests_row_prices_to_its_time_and_the_fit_picks_a_value_on_its_grid():
    """lag_jitter_iterations (an experiment, kvlab/cost/latency.py): θ · a request's row is the time the replay gives
    it, draw included, the means' equations are those rows' means, and fit_spread returns a value of its grid with
    the linear constants fitted at it (the same data, the same answer)."""
    prepared = F.prepare(run_from_dict(RUN, "x"))
    constants = {**F.START, "request_latency_s": 0.004, F.JITTER: 0.5}
    replay = F.replay(prepared, constants)
    assert replay.jitter == 0.5
    theta = F.theta_of(constants)
    e2e, ttft = replay.request_rows()
    np.testing.assert_allclose(ttft @ theta, replay.client_ttft(), rtol=1e-9)
    plain = F.replay(prepared, {**constants, F.JITTER: 0.0})
    assert (ttft @ theta > plain.client_ttft() + 1e-12).any()
    np.testing.assert_allclose(replay.first_token, plain.first_token)  # (the engine's clock: the same)
    predicted = replay.predicted()
    for group, metric, row, _ in replay.equations():
        assert row @ theta == pytest.approx(predicted[group][metric], rel=1e-9)
    fitted = ("bandwidth_efficiency", "request_latency_s", F.JITTER)
    fit = F.fit_spread([replay, plain], fitted, constants)
    assert fit.constants[F.JITTER] in F.JITTER_GRID and fit.fitted == fitted
    assert F.fit_spread([replay, plain], fitted, constants).constants == fit.constants


def test_a_fit_replays_and_folds_with_the_admission_lag_its_start_names():
    """The admission lag is not in θ: a fit carries its start's (F.CARRIED) into every replay, every leave-one-out
    fold and the fitted constants, and one whose start names none replays at vLLM's 1 (ADMISSION_LAG_ITERATIONS)."""
    faster = _with("workload.stages", [{"rate": 30.0, "duration": 1}, {"rate": 60.0, "duration": 1}])
    runs = [run_from_dict(RUN, "x"), run_from_dict({**faster, "id": "tiny2"}, "x")]
    fitted = ("bandwidth_efficiency", "request_latency_s")
    lagged = F.calibrate_runs(runs, fitted, start={"admission_lag_iterations": 1.5}, max_iterations=2)
    assert [r.lag_iterations for r in lagged.replays] == [1.5, 1.5]
    assert lagged.fit.constants["admission_lag_iterations"] == 1.5
    assert [r.lag_iterations for r in F.leave_one_out(lagged)] == [1.5, 1.5]
    document = F.profile_document(lagged.fit.constants, "lagged", "test")
    assert document["constants"]["admission_lag_iterations"] == 1.5
    plain = F.calibrate_runs(runs, fitted, max_iterations=2)
    assert [r.lag_iterations for r in plain.replays] == [F.ADMISSION_LAG_ITERATIONS] * 2
    assert "admission_lag_iterations" not in plain.fit.constants
    # (not inert: at the same constants, the longer lag gives a longer TTFT to the requests that found the engine busy)
    same = {**lagged.fit.constants, "admission_lag_iterations": 1.0}
    assert (F.replay(F.prepare(runs[1]), lagged.fit.constants).client_ttft()
            > F.replay(F.prepare(runs[1]), same).client_ttft()).any()


def test_with_the_lags_step_each_requests_row_prices_to_its_time_and_the_fit_picks_a_value_on_its_grid():
    """lag_step_probability (an experiment, kvlab/cost/latency.py): θ · a request's row is the time the replay gives
    it, step included, the means' equations are those rows' means, and fit_spread returns a value of its grid (the
    same data, the same answer); a fit cannot be asked for the spread and the step at once."""
    prepared = F.prepare(run_from_dict(RUN, "x"))
    constants = {**F.START, "request_latency_s": 0.004, F.STEP: 0.3}
    replay = F.replay(prepared, constants)
    assert replay.step == 0.3 and set(np.unique(replay.extra())) == {0.0, 1.0}
    theta = F.theta_of(constants)
    e2e, ttft = replay.request_rows()
    np.testing.assert_allclose(ttft @ theta, replay.client_ttft(), rtol=1e-9)
    plain = F.replay(prepared, {**constants, F.STEP: 0.0})
    np.testing.assert_allclose(replay.first_token, plain.first_token)  # (the engine's clock: the same)
    moved = ttft @ theta > plain.client_ttft() + 1e-12
    assert moved.any() and not moved.all()
    predicted = replay.predicted()
    for group, metric, row, _ in replay.equations():
        assert row @ theta == pytest.approx(predicted[group][metric], rel=1e-9)
    fitted = ("bandwidth_efficiency", "request_latency_s", F.STEP)
    fit = F.fit_spread([replay, plain], fitted, constants)
    assert fit.constants[F.STEP] in F.STEP_GRID and fit.fitted == fitted and F.JITTER not in fit.constants
    assert F.fit_spread([replay, plain], fitted, constants).constants == fit.constants
    with pytest.raises(KvlabError, match="lag_step_probability and lag_jitter_iterations: valid: one of "):
        F.calibrate_runs([prepared.run, prepared.run], (*fitted, F.JITTER))


def test_a_fitted_admission_lag_prices_each_requests_row_leaves_the_schedule_and_lies_on_its_grid():
    """admission_lag_iterations fitted (fit.LAG, an experiment): the schedule a replay keeps does not depend on the
    lag (only the busy requests' first token and end move, by the lag's difference of their own mean decode
    iterations); the rows at another lag price to what a replay at that lag gives; fit_spread returns a value of
    LAG_GRID, the same answer twice, and a fold that fits the lag replays its run at the lag it fitted."""
    faster = _with("workload.stages", [{"rate": 30.0, "duration": 1}, {"rate": 60.0, "duration": 1}])
    runs = [run_from_dict(RUN, "x"), run_from_dict({**faster, "id": "tiny2"}, "x")]
    constants = {**F.START, "request_latency_s": 0.004, F.LAG: 1.0}
    replays = [F.replay(F.prepare(run), constants) for run in runs]
    later = [F.replay(F.prepare(run), {**constants, F.LAG: 2.5}) for run in runs]
    theta = F.theta_of(constants)
    for a, b in zip(replays, later):
        for name in ("starts", "durations", "first_scheduled", "first_token", "finish", "phi"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))  # (the schedule: the same)
        e2e, ttft = a.request_rows(lag=2.5)
        np.testing.assert_allclose(ttft @ theta, b.client_ttft(), rtol=1e-9)
        predicted = b.predicted()
        for (group, metric, row, _), (_, _, row_b, _) in zip(a.equations(lag=2.5), b.equations()):
            np.testing.assert_allclose(row, row_b, rtol=1e-9)
            assert row @ theta == pytest.approx(predicted[group][metric], rel=1e-9)
    busy = later[1].busy()
    assert busy.any() and not busy.all()
    moved = later[1].client_ttft() > replays[1].client_ttft() + 1e-12
    np.testing.assert_array_equal(moved, busy)  # (only the requests that found the engine busy move)
    fitted = ("bandwidth_efficiency", "request_latency_s", F.LAG)
    fit = F.fit_spread(replays, fitted, constants)
    assert fit.constants[F.LAG] in F.LAG_GRID and fit.fitted == fitted and fit.sigma[F.LAG] == F.LAG_STEP
    assert F.fit_spread(replays, fitted, constants).constants == fit.constants
    folded = F.leave_one_out(F.Calibration(fit=fit, replays=replays, iterations=0))
    for fold in folded:
        assert fold.lag_iterations in F.LAG_GRID and fold.constants[F.LAG] == fold.lag_iterations
    with pytest.raises(KvlabError, match="admission_lag_iterations and lag_jitter_iterations: valid: one of "):
        F.calibrate_runs(runs, (*fitted, F.JITTER))


def test_what_a_decoded_token_reads_prices_to_the_replays_itl():
    """per_output_token · θ is the replay's ITL; its weights column is one read of the weights per output token;
    client_ttft is the TTFT the predicted means are taken over."""
    run = run_from_dict(RUN, "x")
    constants = {**F.START, "seq_overhead_s": 1e-4, "prefill_token_overhead_s": 1e-6}
    replay = F.replay(F.prepare(run), constants)
    per_token = replay.per_output_token()
    assert per_token @ F.theta_of(constants)[:-1] == pytest.approx(replay.predicted()["summary"]["itl_mean"],
                                                                   rel=1e-9)
    decodes = per_token[5]  # sequences per decode iteration, as a decoded token sees them
    assert 1.0 <= decodes <= RUN["max_num_seqs"]
    assert per_token[0] == pytest.approx(replay.prepared.weights_s, rel=0.05)  # one read of the weights per token
    ttft = replay.client_ttft()
    np.testing.assert_allclose(ttft.mean(), replay.predicted()["summary"]["ttft_mean"], rtol=1e-12)
    assert ttft.min() > constants["request_latency_s"]
    assert len(ttft) == run.workload.num_requests * len(F.ARRIVAL_SEEDS)  # (each draw's requests, pooled)
    assert replay.num_preemptions == 0
    assert F.replay(F.prepare(run_from_dict(_with("total_kv_blocks", 24), "x")), constants).num_preemptions > 0


def test_constants_the_runs_cannot_identify_are_refused_with_the_data_that_would():
    prepared = F.prepare(run_from_dict(RUN, "x"))
    rows, labels = F._rows([F.replay(prepared, F.START)])
    with pytest.raises(KvlabError, match=r"cannot fit allreduce_link_efficiency: what it multiplies is 0 in every run"
                                         r" .*tensor-parallel size 2 or more"):
        F.solve(rows, ("bandwidth_efficiency", "allreduce_link_efficiency"), F.START, labels)
    with pytest.raises(KvlabError, match=r"6 equations .* cannot fit 10 constants"):
        F.solve(rows, F.CONSTANTS, F.START, labels)
    with pytest.raises(KvlabError, match=r"cannot tell"):
        F.solve(rows + rows, ("overhead_s", "request_latency_s", "seq_overhead_s", "bandwidth_efficiency",
                              "attention_bandwidth_efficiency", "prefill_token_overhead_s"), F.START, labels)


def test_a_constant_the_runs_do_not_identify_is_held_at_its_start_and_the_rest_fitted_again():
    """Two per-request terms that move in step (the fixed step time and the time outside the engine, both 1 in
    every equation but for a thousandth): fitted together their standard errors dwarf their values, so the rule
    (F.IDENTIFIED) holds the worse at its start and the other takes the sum; the identified one fits its truth."""
    rng = np.random.default_rng(0)
    a = np.zeros((40, len(F.CONSTANTS)))
    a[:, F.CONSTANTS.index("bandwidth_efficiency")] = rng.uniform(0.01, 0.02, 40)  # (θ: 1 / efficiency)
    a[:, F.CONSTANTS.index("overhead_s")] = 1.0
    a[:, F.CONSTANTS.index("request_latency_s")] = 1.0 + 1e-3 * rng.standard_normal(40)
    truth = {**F.START, "bandwidth_efficiency": 0.7, "overhead_s": 0.002, "request_latency_s": 0.008}
    b = a @ F.theta_of(truth) * (1 + 0.01 * rng.standard_normal(40))
    rows = [(row, measured) for row, measured in zip(a, b)]
    asked = ("bandwidth_efficiency", "overhead_s", "request_latency_s")
    free = F.solve(rows, asked, F.START, identified=None)
    assert free.held == () and set(free.fitted) == set(asked)
    assert any(free.sigma[k] >= free.constants[k] for k in ("overhead_s", "request_latency_s"))
    fit = F.solve(rows, asked, F.START)
    assert len(fit.held) == 1 and fit.held[0] in ("overhead_s", "request_latency_s") and fit.identified == 1.0
    (kept,) = set(asked) - set(fit.held) - {"bandwidth_efficiency"}
    assert fit.constants[fit.held[0]] == F.START[fit.held[0]]
    assert fit.constants[kept] + fit.constants[fit.held[0]] == pytest.approx(0.010, rel=0.02)
    assert fit.constants["bandwidth_efficiency"] == pytest.approx(0.7, rel=0.05)
    assert all(fit.sigma[k] < fit.constants[k] for k in fit.fitted)


@pytest.mark.skipif(not TRAINVAL.is_file(), reason="the calibration set (../shared/data/real-vllm) is not here")
def test_the_shipped_profile_is_the_fit_on_the_calibration_set():
    """Replayed under the shipped constants, the 13 runs fit back to them (the fixed point calibrate stops at)."""
    from kvlab.cost.profiles import get_profile

    profile = get_profile("vllm-h100")
    constants = {k: profile.constants.get(k, F.START[k]) for k in F.CONSTANTS}  # (an optional one left out: 0)
    constants |= F.carried(profile.constants)  # (the lag, its spread and its step: fitted on a grid where asked)
    runs = read_runs(TRAINVAL)
    assert [r.id for r in runs] == list(profile.fit["runs"])
    replays = [F.replay(F.prepare(run, arrival_seeds=F.arrivals_of(profile.fit)), constants) for run in runs]
    rows, labels = F._rows(replays)
    fitted, identified = profile.fit["fitted"], profile.fit.get("hold_if_sigma_over_value")
    refit = (F.fit_spread(replays, fitted, constants, identified) if F.SPREADS.keys() & set(fitted)
             else F.solve(rows, fitted, constants, labels, identified))
    for name in fitted:
        sigma = profile.fit["sigma"].get(name, 0.025)  # (the spread's grid step)
        assert refit.constants[name] == pytest.approx(constants[name], rel=0.02, abs=3 * sigma), name


def test_a_run_is_replayed_with_the_users_it_names_or_the_prompts_its_client_sent():
    """The calibration set's client ran its own defaults, 10 system prompts x 10 questions, single turn, whatever
    users a run names (measured.CLIENT_DEFAULTS): with ``sent`` request i sends prompt i mod 100, with the run's
    lengths and load; by default the replay keeps the users the run names."""
    from kvlab.cost.measured import CLIENT_DEFAULTS

    run = run_from_dict(_with("workload.stages", [{"rate": 100.0, "duration": 2}, {"rate": 50.0, "duration": 2}]), "x")
    sent = F.prepare(run, sent=True)
    assert (sent.spec.num_users, sent.spec.enable_multi_turn_chat) == (100, False) == (
        CLIENT_DEFAULTS["num_groups"] * CLIENT_DEFAULTS["num_prompts_per_group"], CLIENT_DEFAULTS["enable_multi_turn_chat"])
    for field in ("system_prompt_len", "question_len", "output_len", "stages", "prompt_overhead_tokens"):
        assert getattr(sent.spec, field) == getattr(run.workload, field)
    hashes = [r.prefix_hashes for r in sent.workload.requests]
    assert len(hashes) == 300 and len(set(hashes)) == 100 and hashes[7] == hashes[107] == hashes[207]
    # 10 system prompts: prompts of a group share their first (system-prompt) chunks, and only those.
    assert hashes[0][:4] == hashes[9][:4] and hashes[0][:4] != hashes[10][:4] and hashes[0][4:] != hashes[9][4:]
    published = F.prepare(run)
    assert published.spec == run.workload
    assert len({r.prefix_hashes for r in published.workload.requests}) == run.workload.num_users == 6
    closed = F.prepare(run, closed_loop=True, sent=True)
    assert closed.spec == run.workload and closed.seeds == F.ARRIVAL_SEEDS  # (the loop serialises the named users)


def test_a_run_is_replayed_once_per_arrival_draw_and_the_draws_pooled():
    """By default the requests arrive as inference-perf's constant timer draws them (kvlab.workload.inference_perf.
    arrival_times), once per seed of F.ARRIVAL_SEEDS, and ``replay`` pools the draws: each draw's requests as its own
    replay would give them, side by side, so a mean's row is the draws' mean and a p99 is over every draw's requests.
    ``arrival_seeds=None``: one replay, evenly spaced."""
    from kvlab.workload.inference_perf import arrival_times

    run = run_from_dict(_with("workload.stages", [{"rate": 100.0, "duration": 2}, {"rate": 50.0, "duration": 2}]), "x")
    assert F.prepare(run).seeds == F.ARRIVAL_SEEDS and len(F.prepare(run).draws) == len(F.ARRIVAL_SEEDS) > 1
    even, three, four = (F.prepare(run, arrival_seeds=s) for s in (None, (3,), (4,)))
    assert [r.arrival_time for r in three.workload.requests] == arrival_times(run.workload, seed=3).tolist()
    assert [r.arrival_time for r in even.workload.requests] == arrival_times(run.workload, seed=None).tolist()
    assert [r.prefix_hashes for r in three.workload.requests] == [r.prefix_hashes for r in even.workload.requests]
    alone = [F.replay(p, dict(F.START)) for p in (three, four)]
    pooled = F.replay(F.prepare(run, arrival_seeds=(3, 4)), dict(F.START))
    assert pooled.stage.tolist() == ([0] * 200 + [1] * 100) * 2 and pooled.within.tolist() == list(range(300)) * 2
    np.testing.assert_allclose(pooled.client_ttft(), np.concatenate([r.client_ttft() for r in alone]), atol=1e-9)
    rows = [r.equations() for r in alone]
    for k, (group, metric, row, _) in enumerate(pooled.equations()):
        assert (group, metric) == rows[0][k][:2] == rows[1][k][:2]
        np.testing.assert_allclose(row, (rows[0][k][2] + rows[1][k][2]) / 2, rtol=1e-9, atol=1e-12)
    e2e = np.concatenate([r.finish + r._lag(20) - r.arrival for r in alone])
    assert pooled.predicted()["summary"]["e2e_p99"] == pytest.approx(np.percentile(e2e, 99))
    with pytest.raises(KvlabError, match="arrival seeds: none given"):
        F.prepare(run, arrival_seeds=())
    # Replayed in forked processes (kvlab calibrate --runs --workers, benchmarks/real_vllm.py --workers): the same.
    jobs = [(F.prepare(run, arrival_seeds=(3, 4)), dict(F.START), None), (three, dict(F.START), None)]
    for got, want in zip(F.replay_all(jobs, workers=2), [pooled, alone[0]]):
        np.testing.assert_array_equal(got.finish, want.finish)
        np.testing.assert_array_equal(got.phi, want.phi)
        assert got.prepared is not None and got.predicted() == want.predicted()


@pytest.mark.parametrize("text, seeds", [("0,1,2,3", (0, 1, 2, 3)), ("0-7", tuple(range(8))), (" 5 ", (5,)),
                                         ("even", None), ("EVEN", None)])
def test_arrivals_option_reads_seeds_or_even(text, seeds):
    assert F.parse_arrivals(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "1,1", "-1", "3-1", "0,x"])
def test_arrivals_option_refuses_what_is_not_seeds(text):
    with pytest.raises(KvlabError, match=f"--arrivals {text!r} is not a list of arrival seeds; valid: .*'even'"):
        F.parse_arrivals(text)


def test_a_profile_is_judged_with_the_arrivals_its_fit_records():
    assert F.arrivals_of({}) == F.ARRIVAL_SEEDS  # (no fit: the default)
    assert F.arrivals_of({"arrivals": "drawn", "arrival_seeds": [5, 6]}) == (5, 6)
    assert F.arrivals_of({"runs": ["a"]}) is None and F.arrivals_of({"arrivals": "even"}) is None  # (fitted evenly)


@pytest.mark.parametrize("seed", [None, 0, 1, 2, 3])
def test_multi_turn_rounds_wait_for_the_users_previous_answer(seed):
    """inference-perf's multi-turn client holds a user's next round until its answer is in (workload/inference_perf.py):
    each request is sent at max(its scheduled time, the client's end of the user's previous request), exactly, on
    evenly spaced arrivals (None) and on drawn ones. (Drawn, seeds 0, 2 and 3 hung the loop before clock60: a round
    released inside the iteration that emptied the engine was added behind the clock, and the idle loop ran to it,
    in the past, which ran nothing.)"""
    from kvlab.cost.latency import admission_lag
    from kvlab.workload.inference_perf import arrival_times, closed_loop_send_times

    raw = _with("workload.num_users_per_system_prompt", 1)
    raw["workload"]["num_unique_system_prompts"] = 2  # two users, one round each 1/20 s at 40 req/s: they overlap
    run = run_from_dict(raw, "x")
    seeds = None if seed is None else (seed,)
    replay = F.replay(F.prepare(run, closed_loop=True, arrival_seeds=seeds), F.START)
    scheduled = arrival_times(run.workload, seed=seed)
    busy = replay.busy()
    client_end = replay.finish + admission_lag(replay.lag_iterations, busy, replay.first_token, replay.finish,
                                               run.workload.output_len)
    assert len(replay.finish) == 60 and np.all(replay.finish > replay.arrival)
    assert np.any(replay.arrival > scheduled)  # (some rounds were held)
    np.testing.assert_array_equal(replay.arrival, closed_loop_send_times(run.workload, scheduled, client_end))
    assert np.all(replay.arrival[2:] >= client_end[:-2])  # a user never has two requests in flight
    assert np.all(replay.first_scheduled >= replay.arrival)  # (none scheduled before it was sent)
    # Without multi-turn, or without closed_loop (the default), every request is sent at its scheduled time.
    np.testing.assert_array_equal(F.replay(F.prepare(run, arrival_seeds=seeds), F.START).arrival, scheduled)
    raw["workload"]["enable_multi_turn_chat"] = False
    open_loop = F.replay(F.prepare(run_from_dict(raw, "x"), closed_loop=True, arrival_seeds=seeds), F.START)
    np.testing.assert_array_equal(open_loop.arrival, scheduled)


def test_a_closed_loop_replay_pools_its_draws():
    """Closed loop on the default draws (F.ARRIVAL_SEEDS): each draw replayed as it is alone, side by side."""
    raw = _with("workload.num_users_per_system_prompt", 1)
    raw["workload"]["num_unique_system_prompts"] = 2
    run = run_from_dict(raw, "x")
    pooled = F.replay(F.prepare(run, closed_loop=True), F.START)
    alone = [F.replay(F.prepare(run, closed_loop=True, arrival_seeds=(s,)), F.START) for s in F.ARRIVAL_SEEDS]
    assert len(pooled.finish) == 60 * len(F.ARRIVAL_SEEDS)
    np.testing.assert_allclose(pooled.client_ttft(), np.concatenate([r.client_ttft() for r in alone]), atol=1e-9)


def test_closed_loop_send_times():
    from kvlab.workload.inference_perf import SharedPrefixSpec, Stage, closed_loop_send_times

    spec = SharedPrefixSpec(num_groups=1, num_prompts_per_group=2, system_prompt_len=16, question_len=16,
                            output_len=4, stages=(Stage(rate=10.0, duration=0.5),), enable_multi_turn_chat=True)
    scheduled = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    end = np.array([0.35, 0.15, 0.5, 0.45, 0.6])  # request 0 (user 0) ends after request 2 was due
    np.testing.assert_allclose(closed_loop_send_times(spec, scheduled, end), [0.0, 0.1, 0.35, 0.3, 0.5])


def test_too_few_runs_for_leave_one_out_is_one_line_naming_them(kvlab, tmp_path):
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": [RUN, {**RUN, "id": "other"}]}))
    r = kvlab("calibrate", "--runs", file, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2
    assert "runs.json holds 2 measured runs ('tiny', 'other'): a fit judged by leave-one-out needs at least 3" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "p.toml").exists()


def test_calibrate_names_each_constant_the_runs_do_not_identify_and_the_data_that_would(kvlab, tmp_path):
    """Three runs of one tiny model at three rates: the weights' read is identified, the rest asked for is not
    (their standard errors past their values); each is held at its start, named with what would fit it, and the
    profile written says which were fitted and which held."""
    import tomllib

    runs = [{**copy.deepcopy(RUN), "id": f"r{i}"} for i in range(3)]
    for i, run in enumerate(runs):
        run["workload"]["stages"] = [{"rate": 10.0 * 2**i, "duration": 1}, {"rate": 20.0 * 2**i, "duration": 1}]
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": runs}))
    asked = ["bandwidth_efficiency", "attention_bandwidth_efficiency", "seq_overhead_s", "request_latency_s"]
    r = kvlab("calibrate", "--runs", file, "--fit", ",".join(asked), "--iterations", "1", "--hold-unidentified",
              "--out", tmp_path / "p.toml")
    assert r.exit_code == 0, r.stderr
    fit = tomllib.loads((tmp_path / "p.toml").read_text())["fit"]
    assert fit["held"] and sorted(fit["fitted"] + fit["held"]) == sorted(asked) and fit["hold_if_sigma_over_value"] == 1
    assert set(fit["held_sigma"]) == set(fit["held"]) == set(fit["held_fitted"])
    text = " ".join(r.stdout.split())
    for name in fit["held"]:
        assert f"not identified: {name}, held at its start" in text
        # the value it was fitted to beside its σ (a user read σ against the start value shown and found it below)
        assert fit["held_sigma"][name] >= fit["held_fitted"][name] or fit["held_fitted"][name] <= 0 or name.endswith("efficiency")
        assert "fitted with the others it came to " in text and ", not below that value, so these runs do not separate" in text
        assert f"more of what would fit it: {F.FIT_HINTS[name]}" in text
    r = kvlab("calibrate", "--runs", file, "--fit", ",".join(asked), "--iterations", "1",
              "--out", tmp_path / "all.toml")  # (by default: every constant asked for is fitted)
    assert r.exit_code == 0, r.stderr
    fit = tomllib.loads((tmp_path / "all.toml").read_text())["fit"]
    assert fit["fitted"] == asked and fit["held"] == [] and "hold_if_sigma_over_value" not in fit
    assert "held at its start" not in r.stdout
    # Trial 49: the constants kept as fitted that the runs do not identify are named, by the rule that would hold them
    profile = tomllib.loads((tmp_path / "all.toml").read_text())
    loose = F.unidentified(profile["constants"], fit["sigma"])
    assert loose and set(loose) <= set(asked)
    assert f"not identified, kept as fitted: {', '.join(loose)} (a standard error not below the value" in " ".join(
        r.stdout.split())
    # the rounds of replay and fit as the progress numbers them (it wrote 0 for the one round printed)
    assert fit["iterations"] == 1 and "iteration 1:" in r.stderr and "iteration 2" not in r.stderr


def test_calibrate_fits_the_admission_lag_where_fit_names_it(kvlab, tmp_path):
    """--fit admission_lag_iterations: the profile written has the lag of LAG_GRID the fit chose, fitted, with the
    grid's step as its σ; its leave-one-out folds fit it too (fit_spread)."""
    import tomllib

    runs = [{**copy.deepcopy(RUN), "id": f"r{i}"} for i in range(3)]
    for i, run in enumerate(runs):
        run["workload"]["stages"] = [{"rate": 10.0 * 2**i, "duration": 1}, {"rate": 20.0 * 2**i, "duration": 1}]
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": runs}))
    asked = ["bandwidth_efficiency", "request_latency_s", F.LAG]
    r = kvlab("calibrate", "--runs", file, "--fit", ",".join(asked), "--iterations", "1", "--out", tmp_path / "p.toml")
    assert r.exit_code == 0, r.stderr
    profile = tomllib.loads((tmp_path / "p.toml").read_text())
    assert profile["fit"]["fitted"] == asked and profile["fit"]["sigma"][F.LAG] == F.LAG_STEP
    assert profile["constants"][F.LAG] in F.LAG_GRID
    assert f"{F.LAG} " in r.stdout and "grid step" in r.stdout  # (the ± column: the grid's step, not a 1σ)


def test_a_fold_that_cannot_fit_names_the_run_it_left_out(kvlab, tmp_path):
    """One run at TP 2 among runs at TP 1: the whole fit prices the all-reduce, the fold without that run cannot."""
    runs = [{**copy.deepcopy(RUN), "id": f"r{i}", "tp": tp} for i, tp in enumerate((2, 1, 1))]
    for i, run in enumerate(runs):
        run["workload"]["stages"] = [{"rate": 10.0 * 2**i, "duration": 1}, {"rate": 20.0 * 2**i, "duration": 1}]
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": runs}))
    r = kvlab("calibrate", "--runs", file, "--fit", "bandwidth_efficiency,allreduce_latency_s,request_latency_s",
              "--iterations", "1", "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and not (tmp_path / "p.toml").exists()
    assert r.stderr.splitlines()[-1].startswith("error: leave-one-out, the fit without run 'r0': cannot fit allreduce_latency_s: what "
                               "it multiplies is 0 in every run")


@pytest.mark.parametrize("flag", ["--client-defaults", "--hold-unidentified", "--arrivals 0-7", "--workers 2"])
def test_a_measured_runs_flag_without_runs_is_one_line(kvlab, tmp_path, flag):
    r = kvlab("calibrate", tmp_path, *flag.split(), "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and r.stderr.strip() == (f"error: {flag} is for a fit on measured runs: give it with --runs FILE"
                                                     " (a fit on bench folders is one least-squares solve)")


@pytest.mark.parametrize("flag, message", [
    (("--arrivals", "0,0"), "error: --arrivals '0,0' is not a list of arrival seeds; valid: distinct seeds from 0"),
    (("--workers", "0"), "error: --workers 0: valid: 1 to 64 processes")])
def test_bad_arrivals_or_workers_are_one_line_before_any_replay(kvlab, tmp_path, flag, message):
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": [RUN, {**RUN, "id": "other"}, {**RUN, "id": "third"}]}))
    r = kvlab("calibrate", "--runs", file, *flag, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(message), r.stderr


def test_the_sets_h100_is_the_sxm_card_for_the_profile_too():
    """The profile a fit writes names the runs' GPU as prepare() priced them ("H100": H100-SXM, RUN_HARDWARE)."""
    runs = [run_from_dict(RUN, "x"), run_from_dict({**RUN, "id": "other"}, "x")]
    assert F.common_gpu(runs) == "H100-SXM"


def test_without_scipy_calibrate_is_one_line_before_any_replay(kvlab, tmp_path, monkeypatch):
    """An installation without the calibrate extra (scipy not importable) is told what to install, at once."""
    import sys

    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": [RUN, {**RUN, "id": "b"}, {**RUN, "id": "c"}]}))
    monkeypatch.setitem(sys.modules, "scipy", None)  # (import scipy now raises ImportError, as where it is absent)
    r = kvlab("calibrate", "--runs", file, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2
    assert r.stderr.strip() == ("error: kvlab calibrate needs SciPy (least squares), which this installation lacks: "
                                "pip install scipy (the calibrate extra: pip install '.[calibrate]' in kvlab's checkout)")
    assert not (tmp_path / "p.toml").exists()


def test_a_runs_cpu_tier_larger_than_the_machine_is_one_line_naming_the_run():
    """A cpu_offload size the machine's CPU memory cannot hold is refused naming the run, not only the option."""
    run = run_from_dict({**RUN, "cpu_offload": 500}, "runs.json, run 0")
    with pytest.raises(KvlabError, match=r"^run 'tiny': --kv-offloading-size 500 GiB is more than the machine's CPU "):
        F.prepare(run)


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_a_fit_that_names_no_constant_is_one_line_before_any_replay(kvlab, tmp_path, value):
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": [RUN, {**RUN, "id": "other"}, {**RUN, "id": "third"}]}))
    r = kvlab("calibrate", "--runs", file, "--fit", value, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and not (tmp_path / "p.toml").exists()
    assert r.stderr.strip().startswith(f"error: --fit {value!r} names no constant; valid: one or more of bandwidth_efficiency")


def test_a_prefill_only_run_says_the_fit_cannot_use_it_not_that_its_itl_is_bad():
    """Trial 52: a run of output_len 1 publishes ITL 0 (no second token); it was refused as 'itl_mean = 0 must be a
    positive, finite duration'. The fit divides each run's decode over output_len - 1 tokens: it cannot use it."""
    raw = _with("workload.output_len", 1)
    for metrics in raw["actual"].values():
        metrics["itl_mean"] = 0
    with pytest.raises(KvlabError, match=r"workload output_len 1: a prefill-only run .* kvlab's fit cannot use it at "
                                         r"all, .* valid: runs with output_len 2 or more \(leave this one out\)$"):
        run_from_dict(raw, "runs.json, run 0")


def test_calibrate_start_carries_the_start_profiles_admission_lag(kvlab, tmp_path):
    """clock53: `--start P` kept only P's fitted constants, so a refit from a profile whose admission lag is not 1
    replayed and wrote lag 1; the constants a fit carries as given (fit.CARRIED) come from the start too."""
    import tomllib

    runs = [{**copy.deepcopy(RUN), "id": f"r{i}"} for i in range(3)]
    for i, run in enumerate(runs):
        run["workload"]["stages"] = [{"rate": 10.0 * 2**i, "duration": 1}, {"rate": 20.0 * 2**i, "duration": 1}]
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": runs}))
    shipped = Path(F.__file__).parent / "data" / "vllm-h100.toml"
    start = tmp_path / "start.toml"
    start.write_text(shipped.read_text().replace("admission_lag_iterations = 1.0", "admission_lag_iterations = 1.375"))
    r = kvlab("calibrate", "--runs", file, "--fit", "bandwidth_efficiency,request_latency_s", "--iterations", "1",
              "--start", start, "--out", tmp_path / "p.toml")
    assert r.exit_code == 0, r.stderr
    assert tomllib.loads((tmp_path / "p.toml").read_text())["constants"]["admission_lag_iterations"] == 1.375


def test_the_admission_lag_and_its_step_fitted_jointly_lie_on_both_grids_and_fit_no_worse_than_either_alone():
    """fit.JOINT (an experiment): fit_spread asked for the lag and the step searches the product of their grids, so
    its pair is on both grids and its loss (spread_loss) is no more than that of the lag fitted with no step, or the
    step at the lag of 1 (both points of the product); the same answer twice; folds fit the pair without their run;
    the spread and the step together are still refused."""
    faster = _with("workload.stages", [{"rate": 30.0, "duration": 1}, {"rate": 60.0, "duration": 1}])
    runs = [run_from_dict(RUN, "x"), run_from_dict({**faster, "id": "tiny2"}, "x")]
    constants = {**F.START, "request_latency_s": 0.004, F.LAG: 1.0}
    replays = [F.replay(F.prepare(run), constants) for run in runs]
    linear = ("bandwidth_efficiency", "request_latency_s")
    joint = F.fit_spread(replays, (*linear, F.LAG, F.STEP), constants)
    assert joint.constants[F.LAG] in F.LAG_GRID and joint.constants[F.STEP] in F.STEP_GRID
    assert set(joint.fitted) == {*linear, F.LAG, F.STEP} and joint.sigma[F.STEP] == F.STEP_STEP
    assert F.fit_spread(replays, (*linear, F.STEP, F.LAG), constants).constants == joint.constants

    def loss(fit):
        given = {"lag": fit.constants.get(F.LAG, 1.0), "step": fit.constants.get(F.STEP, 0.0)}
        return F.spread_loss(replays, F.theta_of(fit.constants), given)

    lag_alone = F.fit_spread(replays, (*linear, F.LAG), constants)
    step_alone = F.fit_spread(replays, (*linear, F.STEP), constants)
    assert loss(joint) <= loss(lag_alone) + 1e-12 and loss(joint) <= loss(step_alone) + 1e-12
    folded = F.leave_one_out(F.Calibration(fit=joint, replays=replays, iterations=0))
    for fold in folded:
        assert fold.lag_iterations in F.LAG_GRID and fold.step in F.STEP_GRID
    with pytest.raises(KvlabError, match="lag_step_probability and lag_jitter_iterations: valid: one of .*"
                                         "admission_lag_iterations with lag_step_probability"):
        F.calibrate_runs(runs, (*linear, F.STEP, F.JITTER))


def _runs_with_a_lag_per_prompt_token(per_token: float, constants: dict) -> list:
    """Three runs of different prompt lengths whose measured times are kvlab's own replay's under ``constants`` plus
    ``per_token`` seconds a prompt token on TTFT and E2E (so the rest of the clock is exact), replayed so."""
    replays = []
    for question in (100, 300, 600):
        raw = _with("workload.question_len", question)
        raw["id"] = f"q{question}"
        prepared = F.prepare(run_from_dict(raw, "x"))
        shift = per_token * prepared.spec.prompt_len
        predicted = F.replay(prepared, constants).predicted()
        raw["actual"] = {group: {m: 1e3 * (v + shift * m.startswith(("e2e", "ttft"))) for m, v in metrics.items()}
                         for group, metrics in predicted.items()}
        replays.append(F.replay(F.prepare(run_from_dict(raw, "x")), constants))
    return replays


def test_a_lag_per_prompt_token_fitted_jointly_is_recovered_by_each_fold_and_shifts_ttft_and_e2e_not_itl():
    """fit.LAG_TERMS (an experiment, benchmarks/real_vllm.py --lag-per --lag-joint): runs whose measured times carry a
    lag of c per prompt token are predicted by leave-one-out with the term fitted in each fold with the other
    constants: each fold finds c and each left-out run comes to its measured times, where the folds without the
    term miss. The term's time is on TTFT and E2E alike, not ITL, and the schedule is not moved by it."""
    per_token = 20e-6
    constants = {**F.START, "request_latency_s": 0.004}
    replays = _runs_with_a_lag_per_prompt_token(per_token, constants)
    calibration = F.Calibration(fit=F.Fit(constants, {}, ("bandwidth_efficiency", "request_latency_s"), 0, 0.0),
                                replays=replays, iterations=0)
    terms = F.LAG_TERM_CHOICES["prompt"]
    lines: list[str] = []
    folded = F.leave_one_out_terms(calibration, terms, progress=lines.append, joint=True)
    assert len(lines) == 3 and all(f"{terms[0]} 2e-05" in line and "request_latency_s 0.004" in line for line in lines)
    for fold, plain in zip(folded, replays):
        run = plain.prepared.run
        assert fold.shift_s == pytest.approx(per_token * fold.prepared.spec.prompt_len, rel=1e-6)
        np.testing.assert_allclose(fold.first_token, plain.first_token, rtol=1e-9)  # (the schedule: the same)
        for metric in ("e2e_mean", "e2e_p99", "ttft_mean", "ttft_p90", "itl_mean"):
            assert fold.predicted()["summary"][metric] == pytest.approx(run.measured("summary", metric), rel=1e-6)
        unshifted = replace(fold, shift_s=0.0).predicted()["summary"]
        assert fold.predicted()["summary"]["ttft_mean"] - unshifted["ttft_mean"] == pytest.approx(fold.shift_s)
        assert fold.predicted()["summary"]["itl_mean"] == pytest.approx(unshifted["itl_mean"])
    without = F.median_abs_errors(F.errors(F.leave_one_out(calibration)))
    assert without["ttft_mean"] > 0.01  # (without the term the folds cannot place it)


def test_a_lag_term_fitted_after_the_engine_leaves_each_folds_engine_and_itl_as_without_it():
    """leave_one_out_terms' default: each fold's engine constants are leave_one_out's (so its ITL is too), and then
    request_latency_s and the term are fitted on the TTFT and E2E equations: the TTFT nearer the measured than
    without the term."""
    constants = {**F.START, "request_latency_s": 0.004}
    replays = _runs_with_a_lag_per_prompt_token(20e-6, constants)
    calibration = F.Calibration(fit=F.Fit(constants, {}, ("bandwidth_efficiency", "request_latency_s"), 0, 0.0),
                                replays=replays, iterations=0)
    folded = F.leave_one_out_terms(calibration, F.LAG_TERM_CHOICES["prompt"])
    plain = F.leave_one_out(calibration)
    for fold, without in zip(folded, plain):
        assert fold.constants["bandwidth_efficiency"] == without.constants["bandwidth_efficiency"]
        assert fold.predicted()["summary"]["itl_mean"] == pytest.approx(without.predicted()["summary"]["itl_mean"])
        assert fold.shift_s > 0
    with_term, without_term = F.median_abs_errors(F.errors(folded)), F.median_abs_errors(F.errors(plain))
    assert with_term["ttft_mean"] < without_term["ttft_mean"]


def test_lag_terms_with_a_profile_fitted_on_a_grid_is_one_line():
    constants = {**F.START, "request_latency_s": 0.004, F.LAG: 1.0}
    fit = F.Fit(constants, {}, ("bandwidth_efficiency", "request_latency_s", F.LAG), 0, 0.0)
    calibration = F.Calibration(fit=fit, replays=[], iterations=0)
    with pytest.raises(KvlabError, match=r"this profile's fit names admission_lag_iterations, fitted on a grid; valid"):
        F.leave_one_out_terms(calibration, F.LAG_TERM_CHOICES["both"])


def test_an_unknown_gpu_in_the_runs_offers_what_calibrate_takes(kvlab, tmp_path):
    """Trial 56: the refusal ended "or give the memory with --gpu-memory-gib", an option calibrate does not have."""
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": [{**RUN, "id": k, "hardware": "H1000"} for k in "abc"]}))
    r = kvlab("calibrate", "--runs", file, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "hardware 'H1000': unknown GPU 'H1000'" in r.stderr and "--gpu-memory-gib" not in r.stderr
    assert "valid: a catalogue GPU as the run's hardware (kvlab gpus lists them)" in r.stderr
