"""Multi-turn sessions: the generator, the user's files with a session column, and what prefix caching sees."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvlab.config import CacheConfig, SchedulerConfig
from kvlab.cost import CostModel
from kvlab.errors import KvlabError
from kvlab.sim import SimConfig, Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import Workload, load_workload
from kvlab.workload.sessions import SessionSpec, conversation_ids, session_table
from kvlab.workload.synthetic import paper_sharegpt_population

COST = CostModel(weights_bytes=8e6, kv_bytes_per_token=800.0, flops_per_token=1.0, attention_flops_per_pair=1.0,
                 memory_bandwidth=1e9, peak_flops=1e15, overhead_s=0.0)


def sessions_of(requests) -> dict[int, list]:
    """Turns grouped by session: a session's first content id (after any system prompt's) is its own."""
    groups: dict[int, list] = {}
    for r in requests:
        groups.setdefault(r.prefix_hashes[0], []).append(r)
    return groups


# The generator -------------------------------------------------------------------------------------------------


def test_each_turn_repeats_the_conversation_so_far_and_adds_a_message():
    wl = load_workload("sessions", rate=4.0, num_requests=3000, seed=2)
    groups = sessions_of(wl.requests)
    assert 500 < len(groups) < 1500  # ~4 turns a session, fewer once the context cap ends some
    assert max(len(turns) for turns in groups.values()) > 3
    for turns in groups.values():
        for before, after in zip(turns, turns[1:]):
            assert after.arrival_time >= before.arrival_time
            assert after.prompt_len > before.prompt_len + before.output_len  # the context, then a message
            assert after.prefix_hashes[:len(before.prefix_hashes)] == before.prefix_hashes
        for turn in turns:
            assert turn.prefix_len == turn.prompt_len + turn.output_len <= 2048  # the whole sequence is named
            assert len(turn.prefix_hashes) == -(-turn.prefix_len // 16) and turn.prefix_chunk_len == 16


def test_rate_seed_and_length_of_the_workload():
    long = load_workload("sessions", rate=8.0, num_requests=12_000, seed=0)
    times = np.array([r.arrival_time for r in long.requests])
    assert np.all(np.diff(times) >= 0) and [r.request_id for r in long.requests] == list(range(12_000))
    # Past the first sessions' ramp (sessions overlap), requests come at the rate asked.
    steady = times[(times > 200) & (times < times[-1] - 1)]
    assert (len(steady) - 1) / (steady[-1] - steady[0]) == pytest.approx(8.0, rel=0.05)
    # The first requests do not depend on how many are drawn; another seed draws others.
    short = load_workload("sessions", rate=8.0, num_requests=500, seed=0)
    assert short.requests == long.requests[:500]
    assert load_workload("sessions", rate=8.0, num_requests=500, seed=1).requests != short.requests
    within = load_workload("sessions", rate=8.0, duration=60.0, seed=0)
    assert within.requests == long.requests[:within.num_requests] and within.requests[-1].arrival_time < 60.0


def test_system_prompts_are_shared_by_the_sessions_that_open_with_them():
    spec = SessionSpec(system_prompt_len=100, num_system_prompts=2, system_prompt_share=0.5)
    table = session_table(spec, paper_sharegpt_population(), num_requests=2000, duration=None, rate=4.0)
    openings = {tuple(range(6)): set(), tuple(range(6, 12)): set()}  # 100 tokens: 6 whole chunks of 16 each
    without = set()
    for ids in table.prefix_hashes:
        if ids[:6] in openings:
            openings[ids[:6]].add(ids[6])  # the chunk straddling the prompt's end: the session's own
        else:
            assert min(ids) >= 12  # a session without a system prompt shares no id with one
            without.add(ids[0])
    assert all(len(sessions) > 50 for sessions in openings.values())  # both prompts, many sessions each
    assert not openings[tuple(range(6))] & openings[tuple(range(6, 12))]
    num_sessions = sum(len(s) for s in openings.values()) + len(without)
    assert 0.4 < len(without) / num_sessions < 0.6  # system_prompt_share 0.5


def _config(**numbers) -> SimConfig:
    numbers = dict(num_slots=16 * 4096, block_size=16, max_model_len=2048, max_num_seqs=64,
                   max_num_batched_tokens=4096) | numbers
    parts = {kind: {k: v for k, v in numbers.items() if k in {f.name for f in dataclasses.fields(kind)}}
             for kind in (CacheConfig, SchedulerConfig)}
    return SimConfig(CacheConfig(**parts[CacheConfig]), COST, SchedulerConfig(**parts[SchedulerConfig]))


def test_prefix_caching_finds_the_previous_turn_and_the_system_prompt():
    """On one engine with room for everything (nothing evicted): a later turn finds every whole block of the turn
    before it (prompt and answer, but the answer's last token, whose KV is never written); a session's first turn
    finds the two whole blocks of its 40-token system prompt once another session computed them."""
    spec = SessionSpec(system_prompt_len=40, system_prompt_share=1.0, think_time_s=30.0)
    wl = load_workload("sessions", rate=1.0, num_requests=300, seed=3, sessions=spec)
    sim = Simulation(parse_strategy("vllm+prefix"), _config(num_slots=16 * 40_000), wl)
    sim.run()
    seqs = sim.seqs
    groups: dict[int, list] = {}
    for r in wl.requests:
        groups.setdefault(r.prefix_hashes[2], []).append(r)  # chunks 0, 1: the system prompt; 2: the session's
    first_done = min(seqs[turns[0].request_id].finish_time for turns in groups.values())
    num_turns = num_firsts = 0
    for turns in groups.values():
        if turns[0].arrival_time > first_done:
            assert seqs[turns[0].request_id].num_cached_tokens == 32
            num_firsts += 1
        for before, after in zip(turns, turns[1:]):
            if seqs[before.request_id].finish_time < after.arrival_time:
                written = before.prompt_len + before.output_len - 1
                assert seqs[after.request_id].num_cached_tokens == written // 16 * 16
                num_turns += 1
    assert num_turns > 50 and num_firsts > 50


def test_conversation_ids_repeat_the_context_or_diverge_where_the_prompt_stops():
    turns = [(7, 20, 10), (7, 40, 5), (7, 30, 3), (8, 5, 5)]
    hashes, prefix_len = conversation_ids(turns, 8)
    assert prefix_len == (30, 45, 33, 10)
    assert hashes[0] == (0, 1, 2, 3)  # 30 tokens: 4 chunks of 8
    assert hashes[1] == (0, 1, 2, 3, 4, 5)  # 40 > 30: the context and a message, 45 tokens
    # 30 <= 45: the prompt repeats its first 29 tokens, 3 whole chunks, then differs: new ids from chunk 3.
    assert hashes[2] == (0, 1, 2, 6, 7)
    assert hashes[3] == (8, 9)  # another session: its own ids


@pytest.mark.parametrize(("options", "message"), [
    (dict(turns=0.5), r"--session-turns 0.5: a mean number of turns per session, 1 or more"),
    (dict(turns=2.5, turns_dist="fixed"), r"--session-turns 2.5 with --session-turns-dist fixed"),
    (dict(turns_dist="uniform"), r"--session-turns-dist 'uniform'; valid: geometric, fixed"),
    (dict(think_time_s=-1.0), r"--think-time -1.0: seconds between a session's turns; valid: a number >= 0"),
    (dict(think_time_s=float("nan")), r"--think-time nan"),
    (dict(think_time_dist="normal"), r"--think-time-dist 'normal'; valid: exponential, fixed"),
    (dict(system_prompt_len=-3), r"--system-prompt-len -3"),
    (dict(num_system_prompts=0), r"--num-system-prompts 0"),
    (dict(system_prompt_share=1.5), r"--system-prompt-share 1.5; valid: a share from 0 to 1"),
    (dict(max_context_len=1), r"--max-context-len 1"),
])
def test_bad_session_options_get_one_line(options, message):
    with pytest.raises(KvlabError, match=message):
        SessionSpec(**options)


def test_sessions_need_a_rate_a_process_and_room():
    with pytest.raises(KvlabError, match="sessions needs --rate"):
        load_workload("sessions", num_requests=10)
    with pytest.raises(KvlabError, match="--arrival burst for sessions: .* valid: --arrival poisson or gamma"):
        session_table(SessionSpec(), paper_sharegpt_population(), num_requests=10, duration=None, rate=1.0,
                      arrival="burst")
    with pytest.raises(KvlabError, match="sessions cannot arrive on a trace's own times .* valid: --arrival auto, "
                                         "poisson or gamma"):
        load_workload("sessions", num_requests=10, arrival="trace")
    with pytest.raises(KvlabError, match="sessions cannot arrive as a burst"):  # (before --rate's own checks)
        load_workload("sessions", num_requests=10, arrival="burst", rate=2.0)
    with pytest.raises(KvlabError, match="--max-context-len 4,096 exceeds max_model_len 2,048"):
        load_workload("sessions", rate=1.0, num_requests=10, max_model_len=2048, long_requests="clip",
                      sessions=SessionSpec(max_context_len=4096))
    with pytest.raises(KvlabError, match="session options apply to --workload sessions only"):
        load_workload("paper-sharegpt", rate=1.0, num_requests=10, sessions=SessionSpec())
    with pytest.raises(KvlabError, match="--system-prompt-len 3,000 leaves no room .* valid: at most 2,046"):
        load_workload("sessions", rate=1.0, num_requests=10, sessions=SessionSpec(system_prompt_len=3000))
    with pytest.raises(KvlabError, match="--session-lengths 'paper-alpaca'"):
        load_workload("sessions", rate=1.0, num_requests=10, sessions=SessionSpec(lengths="paper-alpaca"))
    gamma = load_workload("sessions", rate=2.0, num_requests=50, arrival="gamma", cv=2.0)
    assert gamma.num_requests == 50 and "gamma (CV 2)" in gamma.description


# The user's files ----------------------------------------------------------------------------------------------


def test_a_session_file_with_think_times(tmp_path):
    path = tmp_path / "chats.csv"
    path.write_text("session_id,prompt_len,output_len,think_time\n"
                    "1,100,50,0\n2,80,40,0.5\n1,170,30,10\n2,130,20,12\n1,205,10,5\n")
    wl = load_workload(str(path))
    assert [(r.arrival_time, r.prompt_len) for r in wl.requests] == [(0.0, 100), (0.5, 80), (10.0, 170),
                                                                      (12.5, 130), (15.0, 205)]
    # Session 1: 150 tokens (10 chunks), then its 170-token prompt repeats them and adds 20: 200 tokens.
    assert wl.requests[0].prefix_hashes == tuple(range(10)) and wl.requests[0].prefix_len == 150
    assert wl.requests[2].prefix_hashes == (*range(10), 18, 19, 20)
    assert wl.requests[3].prefix_hashes == (*range(10, 18), 21, 22)
    assert "turns of conversations" in wl.description
    # Their own arrivals, rescaled or kept; not redrawn (turns would leave their sessions' order).
    assert load_workload(str(path), rate=1.0).requests[4].arrival_time == pytest.approx(4.0)
    with pytest.raises(KvlabError, match="holds conversations: .* valid: --arrival auto or trace"):
        load_workload(str(path), arrival="poisson", rate=1.0)
    with pytest.raises(KvlabError, match="--long-requests clip would cut turns"):
        load_workload(str(path), long_requests="clip", max_model_len=100)


def test_a_session_file_with_arrival_times_orders_turns_by_time(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text('{"session_id": 4, "prompt_len": 60, "output_len": 20, "arrival_time": 9.0}\n'
                    '{"session_id": 4, "prompt_len": 30, "output_len": 10, "arrival_time": 1.0}\n')
    wl = load_workload(str(path))
    assert [r.prompt_len for r in wl.requests] == [30, 60]
    assert wl.requests[1].prefix_hashes[:3] == wl.requests[0].prefix_hashes  # 40 tokens: 3 chunks, then on


@pytest.mark.parametrize(("header", "row", "message"), [
    ("session_id,prompt_len,output_len,think_time", "1.5,10,5,1", r"line 2: session_id '1.5' is not a whole number "
                                                                    r">= 0; valid: a session id"),
    ("session_id,prompt_len,output_len,think_time", "abc,10,5,1", r"line 2: session_id 'abc' is not a whole number"),
    ("session_id,prompt_len,output_len,think_time", "-1,10,5,1", r"line 2: session_id '-1' is not a whole number"),
    ("session_id,prompt_len,output_len,think_time", ",10,5,1", r"line 2: missing field 'session_id'"),
    ("session_id,prompt_len,output_len,think_time", "1,10,5,-2", r"line 2: think_time '-2' is negative; valid: "
                                                                   r"seconds after the session's previous turn"),
    ("session_id,prompt_len,output_len,think_time", "1,10,5,inf", r"line 2: think_time 'inf' is not a finite number"),
    ("session_id,prompt_len,output_len,think_time,arrival_time", "1,10,5,1,3", r"line 2: both arrival_time and "
                                                                                r"think_time are given"),
    ("prompt_len,output_len,think_time", "10,5,1", r"line 2: think_time needs a session_id column"),
    ("session_id,prompt_len,output_len", "1,10,5", r"line 2: a turn of session 1 has no arrival_time and no "
                                                     r"think_time"),
])
def test_bad_session_columns_get_one_line(tmp_path, header, row, message):
    path = tmp_path / "chats.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(KvlabError, match=message):
        load_workload(str(path))


def test_a_misspelt_session_column_is_named(tmp_path):
    path = tmp_path / "chats.csv"
    path.write_text("sesion_id,prompt_len,output_len,arrival_time\n1,10,5,0\n")
    with pytest.raises(KvlabError, match="column 'sesion_id' would be ignored, .*; did you mean 'session_id'"):
        load_workload(str(path))


def test_the_cli_refuses_a_bad_think_time_in_one_line(kvlab, tmp_path):
    path = tmp_path / "chats.csv"
    path.write_text("session_id,prompt_len,output_len,think_time\n1,10,5,0\n1,30,5,-0.5\n")
    result = kvlab("run", "vllm", "--workload", str(path))
    assert result.exit_code == 2
    assert "line 3: think_time '-0.5' is negative" in result.stderr and "Traceback" not in result.stderr


def test_a_session_workload_runs_whole_on_one_engine():
    wl = load_workload("sessions", rate=0.5, num_requests=200, seed=4)
    assert isinstance(wl, Workload)
    result = Simulation(parse_strategy("vllm+prefix"), _config(), wl).run()
    assert result.counters.num_finished == 200 and result.counters.num_rejected == 0
