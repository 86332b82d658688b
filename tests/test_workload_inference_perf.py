"""inference-perf's shared_prefix workload (kvlab/workload/inference_perf.py): arrivals, users, shared content."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.workload import load_workload
from kvlab.workload.inference_perf import (
    CHUNK_LEN,
    SharedPrefixSpec,
    Stage,
    arrival_times,
    read_config,
    shared_prefix_table,
    spec_from_dict,
    stage_of,
    user_prefix_ids,
)

CONFIG = """\
data:
  type: shared_prefix
  shared_prefix:
    num_groups: 2
    num_prompts_per_group: 3
    system_prompt_len: 40
    question_len: 20
    output_len: 5
    enable_multi_turn_chat: true
load:
  type: constant
  stages:
    - {rate: 2.0, duration: 3}
    - {rate: 4.0, duration: 1}
"""


def _spec(**kw) -> SharedPrefixSpec:
    values = dict(num_groups=2, num_prompts_per_group=3, system_prompt_len=40, question_len=20, output_len=5,
                  stages=(Stage(2.0, 3), Stage(4.0, 1)))
    return SharedPrefixSpec(**{**values, **kw})


def test_stages_send_rate_times_duration_evenly_spaced_one_after_the_other():
    """``seed=None``: evenly spaced (kvlab's replay before 7 December, kept for comparison)."""
    spec = _spec()
    times = arrival_times(spec, seed=None)
    assert times.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.25, 3.5, 3.75]
    assert spec.num_requests == 10
    assert stage_of(spec, times).tolist() == [0] * 6 + [1] * 4


def test_each_stage_draws_inference_perfs_exponential_gaps_scaled_to_its_duration():
    """inference-perf's ConstantLoadTimer (inference_perf/loadgen/load_timer.py): a stage's rate x duration gaps are
    exponential draws scaled to sum to its duration, so its "constant" load is Poisson arrivals held to their count.
    kvlab draws the same way by default (seed DEFAULT_SEED; the first request at the stage's start), the same times
    for the same seed."""
    from kvlab.workload.inference_perf import DEFAULT_SEED

    spec = _spec(stages=(Stage(20.0, 50), Stage(40.0, 50)))
    times = arrival_times(spec, seed=0)
    assert DEFAULT_SEED == 0 and np.array_equal(arrival_times(spec), times)
    stages = stage_of(spec, times)
    assert len(times) == spec.num_requests == 3000 and np.all(np.diff(times) >= 0)
    assert stages.tolist() == [0] * 1000 + [1] * 2000
    for k, (start, stage) in enumerate(zip(spec.stage_starts, spec.stages)):
        mine = times[stages == k]
        gaps = np.diff(mine)
        assert mine[0] == start and start < mine[-1] < start + stage.duration
        assert 0.9 < gaps.std() / gaps.mean() < 1.1  # (exponential: a coefficient of variation of 1; evenly: 0)
        assert abs(gaps.mean() * stage.rate - 1) < 0.01
    assert np.array_equal(times, arrival_times(spec, seed=0)) and not np.array_equal(times, arrival_times(spec, seed=1))
    assert np.array_equal(arrival_times(spec, 7, seed=0), times[:7])
    assert np.array_equal(shared_prefix_table(spec, seed=0).arrival_time, times)
    assert np.ptp(np.diff(arrival_times(spec, seed=None)[:1000])) < 1e-9  # (None: evenly spaced, as before)


def test_a_drawn_stage_larger_than_a_block_keeps_its_first_requests_and_its_duration():
    """A drawn stage's gaps come a block at a time (inference_perf.BLOCK), each block's sum drawn first, so a limit
    draws only its blocks, the first requests are the same with or without it, and the stage still ends on time."""
    import kvlab.workload.inference_perf as inference_perf

    spec = _spec(stages=(Stage(1000.0, 3.0), Stage(10.0, 1.0)))
    old, inference_perf.BLOCK = inference_perf.BLOCK, 256
    try:
        times = arrival_times(spec, seed=2)
        assert np.array_equal(arrival_times(spec, 300, seed=2), times[:300])
    finally:
        inference_perf.BLOCK = old
    first = times[:3000]
    gaps = np.diff(first)
    assert len(times) == 3010 and first[0] == 0.0 and first[-1] < 3.0 and np.all(gaps > 0)
    assert 0.9 < gaps.std() / gaps.mean() < 1.1 and abs(gaps.mean() * 1000 - 1) < 0.01
    # The stage's gaps sum to its duration: its first gap (drawn, the first request sent at the start) is what is left.
    assert 0 < 3.0 - first[-1] < 0.02


def test_request_i_goes_to_user_i_mod_users_and_users_of_a_group_share_the_system_prompt():
    spec = _spec()
    table = shared_prefix_table(spec)
    assert table.prompt_len.tolist() == [60] * 10 and table.output_len.tolist() == [5] * 10
    hashes = table.prefix_hashes
    # 60 tokens: 4 chunks of 16; the first two lie wholly in the 40-token system prompt.
    assert hashes[0] == (0, 0, 2, 2) and hashes[1] == (0, 0, 3, 3) and hashes[3] == (1, 1, 5, 5)
    assert hashes[6] == hashes[0] and hashes[7] == hashes[1]  # user 0 and 1 again, 6 requests later
    assert len(hashes[0]) * CHUNK_LEN >= spec.prompt_len - 1


def test_prompt_overhead_tokens_lengthen_the_users_own_part():
    spec = _spec(prompt_overhead_tokens=30)
    assert spec.prompt_len == 90
    assert user_prefix_ids(spec, 4) == (1, 1) + (6,) * 4


def test_a_config_file_is_a_workload_and_prefix_caching_finds_the_shared_blocks(tmp_path):
    path = tmp_path / "ip.yaml"
    path.write_text(CONFIG)
    workload = load_workload(str(path))
    assert workload.num_requests == 10
    # (the arrivals inference-perf's constant timer would draw: kvlab's default draw, DEFAULT_SEED)
    assert [r.arrival_time for r in workload.requests] == arrival_times(read_config(str(path))).tolist()
    assert workload.requests[3].prefix_hashes == (1, 1, 5, 5)

    from kvlab.memory.paged import PagedAllocator

    allocator = PagedAllocator(64, 16, enable_prefix_caching=True, max_model_len=4096)
    seqs = _admit(allocator, workload.requests[:2])
    # Request 1 (user 1, same group as user 0) finds the two system-prompt blocks request 0 cached.
    assert seqs == [0, 32]
    assert _admit(allocator, workload.requests[6:7]) == [48]  # user 0 again: its whole prompt but the last block


def _admit(allocator, requests) -> list[int]:
    from kvlab.sched.seq import Seq

    hits = []
    for request in requests:
        seq = Seq(request)
        hit = allocator.get_num_cached_tokens(seq)
        hits.append(hit)
        allocator.allocate_slots(seq, request.prompt_len - hit, hit)
        seq.num_computed_tokens = request.prompt_len
    return hits


def test_the_calibration_sets_flat_record_reads_as_the_same_spec():
    record = {"num_unique_system_prompts": 2, "num_users_per_system_prompt": 3, "system_prompt_len": 40,
              "question_len": 20, "output_len": 5, "enable_multi_turn_chat": True, "load_type": "constant",
              "stages": [{"rate": 2.0, "duration": 3}, {"rate": 4.0, "duration": 1}]}
    assert spec_from_dict(record, "run 1") == _spec(enable_multi_turn_chat=True)


@pytest.mark.parametrize(("change", "message"), [
    ({"load": {"type": "poisson", "stages": [{"rate": 1, "duration": 1}]}}, "load type 'poisson' is not supported"),
    ({"load": {"stages": [{"concurrency_level": 4}]}}, "stage 0 is"),
    ({"load": {"stages": [{"rate": 0, "duration": 10}]}}, "sends no request"),
    ({"data": {"type": "random"}}, "data.type 'random' is not supported"),
    ({"data": {"shared_prefix": {"num_groups": 2}}}, "missing field 'num_prompts_per_group'"),
    ({"data": {"shared_prefix": {"num_groups": 2.5, "num_prompts_per_group": 1, "system_prompt_len": 1,
                                 "question_len": 1, "output_len": 1}}}, "num_groups = 2.5 is not a whole number"),
])
def test_bad_configurations_are_one_line_naming_the_field(change, message):
    import yaml

    data = {**yaml.safe_load(CONFIG), **change}
    with pytest.raises(KvlabError, match=message):
        spec_from_dict(data, "ip.yaml")


def test_the_arrivals_are_a_float_array_in_order():
    times = arrival_times(_spec())
    assert times.dtype == np.float64 and np.all(np.diff(times) > 0)


def _with(section: str, **extra):
    import yaml

    data = yaml.safe_load(CONFIG)
    (data["data"]["shared_prefix"] if section == "shared_prefix" else data["load"]).update(extra)
    return data


@pytest.mark.parametrize(("section", "key"), [("shared_prefix", "foo"), ("shared_prefix", "enable_multi_turn_chta"),
                                              ("load", "num_wrokers"), ("load", "wroker_max_concurrency")])
def test_an_unknown_key_is_refused_naming_it_the_file_and_the_valid_keys(section, key):  # (trial 48, finding 11)
    with pytest.raises(KvlabError, match=rf"^ip.yaml: {section}: unknown key '{key}'; valid: .*"
                                          + ("enable_multi_turn_chat" if section == "shared_prefix" else "num_workers")):
        spec_from_dict(_with(section, **{key: 1}), "ip.yaml")


def test_keys_inference_perf_takes_are_accepted():
    spec = spec_from_dict(_with("shared_prefix", seed=3), "ip.yaml")
    assert spec == spec_from_dict(_with("load", num_workers=4, worker_max_concurrency=8, interval=1.0), "ip.yaml")


def test_poisson_refusal_says_how_to_get_poisson_arrivals_and_errors_share_one_prefix():
    with pytest.raises(KvlabError, match=r"--arrival poisson --rate R"):
        spec_from_dict(_with("load", type="poisson"), "ip.yaml")
    with pytest.raises(KvlabError, match=r"^ip.yaml: shared_prefix: num_groups = 0 must"):
        spec_from_dict(_with("shared_prefix", num_groups=0), "ip.yaml")


@pytest.mark.parametrize("written, message", [
    ("question_len: 020", "question_len = '020' has a leading 0: YAML 1.1, which inference-perf reads with, takes it "
                          "as octal 16, kvlab's --config as 20; valid: 20 or 16, without the leading 0"),
    ("question_len: 0x14", "question_len = '0x14' is hexadecimal; valid: 20, in decimal digits"),
    ("question_len: 2e1", "question_len = '2e1' is not a whole number as inference-perf reads a count (it takes no "
                          "exponent or fraction there); valid: 20"),  # (trial 52 #7: it ran as 20)
    ("question_len: x", "question_len = 'x' is not a whole number written in digits (such as 512); valid: a whole "
                        "number of tokens or users, such as 20"),
])
def test_a_yaml_number_inference_perf_reads_otherwise_or_not_at_all_is_refused_with_the_valid_form(tmp_path, written,
                                                                                                     message):
    """Trial 52 #7 and #11: '020' was refused with no reason and no valid form, and 1e1 ran as a count."""
    path = tmp_path / "ip.yaml"
    path.write_text(CONFIG.replace("question_len: 20", written))
    with pytest.raises(KvlabError, match=re.escape(message)):
        load_workload(str(path))
    path.write_text(CONFIG.replace("{rate: 2.0, duration: 3}", "{rate: 2.0, duration: 010}"))
    with pytest.raises(KvlabError, match=re.escape("stage 0's duration '010' has a leading 0")):
        load_workload(str(path))


@pytest.mark.parametrize("written", ["question_len: '20'", "question_len: 2_0", "question_len: 20.0",
                                     "question_len: ' 20 '", "question_len: '020'", "question_len: 2.0e+1",
                                     "question_len: 2.0E+1", 'question_len: "0020"'])
def test_a_count_inference_perf_reads_unambiguously_is_taken_as_it_reads_it(tmp_path, written):
    """Trial 52 #7 and #11: a quoted count ('2', which inference-perf's pydantic reads as 2) was refused while a
    quoted rate was taken; 2_0 is 20 to YAML 1.1, pydantic and Python alike. Trial 54, finding 6: a quoted '020' is
    text to PyYAML, which pydantic reads in decimal (20), and an unquoted 2.0e+1 a YAML 1.1 float (20.0), which
    pydantic takes as a whole count; both were refused (an unquoted 020, octal 16 to YAML 1.1, still is)."""
    path = tmp_path / "ip.yaml"
    path.write_text(CONFIG.replace("question_len: 20", written).replace("rate: 2.0", "rate: '2_0'"))
    spec = read_config(str(path))
    assert spec.question_len == 20 and spec.stages[0].rate == 20.0


@pytest.mark.parametrize("written, rate", [("rate: '010'", 10.0), ("rate: 1.5e+3", 1500.0), ("rate: 1e1", 10.0),
                                           ("rate: '1.5e+3'", 1500.0)])
def test_a_rate_is_read_as_inference_perf_reads_it(tmp_path, written, rate):
    """Trial 54, finding 6: inference-perf reads its file with PyYAML's safe_load, then pydantic's lax float: a
    quoted '010' is 10.0 (it was refused for a leading 0 that only an unquoted one has)."""
    path = tmp_path / "ip.yaml"
    path.write_text(CONFIG.replace("rate: 2.0", written))
    assert read_config(str(path)).stages[0].rate == rate


def test_a_huge_stage_is_weighed_before_its_arrivals_are_built_and_n_builds_only_n(kvlab, tmp_path, monkeypatch):
    """Trial 56: a stage of 10^6 req/s for 10^6 s ran out of memory building 10^12 arrivals (a traceback), even
    with -n 50; a stage of 10^7 requests took 6 s to be refused."""
    import kvlab.workload.inference_perf as inference_perf

    path = tmp_path / "huge.yaml"
    path.write_text(CONFIG.replace("- {rate: 2.0, duration: 3}", "- {rate: 1000000.0, duration: 1000000.0}"))
    built = []
    real = inference_perf.arrival_times
    monkeypatch.setattr(inference_perf, "arrival_times", lambda spec, limit=None, seed=None: built.append(limit) or real(spec, limit, seed))
    r = kvlab("run", "vllm", "-w", path)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: workload huge.yaml means about 1,000,000,000,004 requests") and "--yes" in r.stderr
    assert built == []  # refused before any arrival was built
    r = kvlab("run", "vllm", "-w", path, "-n", "50", "--json")
    assert r.exit_code == 0, r.stderr
    assert set(built) == {50}  # only the 50 kept requests
    assert '"num_requests": 50' in r.stdout


def test_the_first_requests_are_the_whole_configurations_first_requests():
    spec = _spec()
    assert list(arrival_times(spec, 7)) == list(arrival_times(spec)[:7])
    assert list(arrival_times(spec, 100)) == list(arrival_times(spec))
    assert shared_prefix_table(spec, limit=4).prefix_hashes == shared_prefix_table(spec).prefix_hashes[:4]


@pytest.mark.parametrize("duration", [0.5, 2.0, 3.0, 3.2, 10.0])
def test_a_duration_keeps_the_same_requests_whether_or_not_the_rest_are_built(tmp_path, duration):
    from kvlab.workload.inference_perf import requests_before

    path = tmp_path / "ip.yaml"
    path.write_text(CONFIG)
    times = arrival_times(_spec())
    assert requests_before(_spec(), duration) >= int(np.searchsorted(times, duration, side="left"))
    workload = load_workload(str(path), duration=duration)
    assert [r.arrival_time for r in workload.requests] == [t for t in times if t < duration]


def test_the_docs_example_configuration_runs_as_its_comment_says(tmp_path):  # (trial 60, finding 7: no example)
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "workloads.md").read_text(encoding="utf-8")
    example = re.search(r"`shared-prefix\.yaml`:\n\n```yaml\n(.*?)```", docs, re.S)
    assert example, "docs/workloads.md lost its inference-perf example"
    path = tmp_path / "shared-prefix.yaml"
    path.write_text(example.group(1))
    spec = read_config(str(path))
    workload = load_workload(str(path))
    stages = stage_of(spec, [r.arrival_time for r in workload.requests])
    # "180 requests: 60 at 2/s, then 120 at 4/s"; 4 groups x 5 users; 200 + 300 prompt tokens, 100 out
    assert workload.num_requests == 180 and np.bincount(stages).tolist() == [60, 120]
    assert {(r.prompt_len, r.output_len) for r in workload.requests} == {(500, 100)}
    assert len({r.prefix_hashes for r in workload.requests}) == 20
