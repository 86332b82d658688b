"""vLLM's --scheduling-policy priority: the waiting order and the preemption victim, on tiny pools at exact block
ids, and the invariants on any input (hypothesis): every request finishes, no block is lost or owned twice, and
runs give what stepping gives.

vLLM's semantics (vllm/v1/core/sched/request_queue.py, PriorityRequestQueue; vllm/v1/request.py, Request.__lt__;
vllm/v1/core/sched/scheduler.py, Scheduler.schedule's running loop): waiting requests are served by (priority,
arrival time), smaller first, a preempted one going back to its place (not the front); when memory runs out, the
victim is the running request with the largest (priority, arrival time), and if it was scheduled earlier in the
same iteration its tokens are taken back.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.config.engine import SchedulerConfig
from kvlab.memory.paged import PagedAllocator
from kvlab.sched.policy import PriorityQueue
from kvlab.sched.runs import RunScheduler
from kvlab.sched.scheduler import Scheduler
from kvlab.sched.seq import Seq, SeqStatus
from kvlab.workload.request import Request


def _seq(request_id: int, arrival: float, prompt: int, output: int, priority: int) -> Seq:
    return Seq(Request(request_id, arrival, prompt, output, priority=priority))


def _scheduler(num_blocks: int, *, policy: str = "priority", budget: int = 64, block_size: int = 4,
               cls: type[Scheduler] = Scheduler) -> Scheduler:
    allocator = PagedAllocator(num_blocks, block_size, max_model_len=256)
    return cls(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=256,
                               scheduling_policy=policy), allocator)


def _step(sched: Scheduler, now: float = 0.0):
    out = sched.schedule()
    finished = sched.update_from_output(out, now)
    return out, finished


def test_the_priority_queue_serves_by_priority_then_arrival_and_a_preempted_request_goes_back_to_its_place():
    queue = PriorityQueue()
    a, b, c, d = _seq(0, 0.0, 8, 4, 1), _seq(1, 1.0, 8, 4, 0), _seq(2, 2.0, 8, 4, 1), _seq(3, 3.0, 8, 4, 0)
    for seq in (a, b, c, d):
        queue.append(seq)
    assert [s.request_id for s in queue] == [1, 3, 0, 2]
    assert queue[0] is b and queue.popleft() is b and len(queue) == 3
    queue.appendleft(b)  # (vLLM's prepend_request under priority: its place, not the front)
    assert [s.request_id for s in queue] == [1, 3, 0, 2]
    queue.popleft()
    queue.popleft()
    queue.appendleft(d)
    assert [s.request_id for s in queue] == [3, 0, 2]


def test_a_later_arrival_of_higher_priority_is_admitted_first():
    sched = _scheduler(40, budget=16)
    low, high = _seq(0, 0.0, 12, 3, 5), _seq(1, 0.5, 12, 3, 0)
    sched.add_request(low)
    sched.add_request(high)
    out, _ = _step(sched)
    # The budget of 16 tokens: the high-priority request's whole prompt first, then a chunk of the other's.
    assert out.new_req_ids == (1, 0)
    assert out.num_scheduled_tokens == {1: 12, 0: 4}
    assert sched.allocator.get_block_ids(1) == [1, 2, 3]
    assert sched.allocator.get_block_ids(0) == [4]


def test_the_victim_is_the_lowest_priority_latest_arrival_not_the_newest():
    # 7 usable blocks of 4 slots. Three requests of 8-token prompts: 2 blocks each, 6 held, 1 free. The one
    # admitted last (request 2) has the highest priority; FCFS would evict it, priority evicts request 1 (priority
    # 2, the largest), which is in the middle of the running batch.
    sched = _scheduler(8, budget=64)
    for seq in (_seq(0, 0.0, 8, 20, 1), _seq(1, 0.1, 8, 20, 2), _seq(2, 0.2, 8, 20, 0)):
        sched.add_request(seq)
    out, _ = _step(sched)
    assert out.new_req_ids == (2, 0, 1)  # admitted in priority order
    assert [s.request_id for s in sched.running] == [2, 0, 1]
    assert {s.request_id: sched.allocator.get_block_ids(s.request_id) for s in sched.running} == {
        2: [1, 2], 0: [3, 4], 1: [5, 6]}
    # Next iteration: each decodes its 9th token and needs a third block; one block (7) is free.
    out, _ = _step(sched)
    assert out.preempted_req_ids == (1,)
    assert out.num_scheduled_tokens == {2: 1, 0: 1}
    assert sched.allocator.get_block_ids(2) == [1, 2, 7]
    assert sched.allocator.get_block_ids(0) == [3, 4, 6]  # (request 1's blocks came back, tail first)
    assert [s.request_id for s in sched.waiting] == [1]
    assert sched.waiting[0].status is SeqStatus.PREEMPTED and sched.waiting[0].num_computed_tokens == 0


def test_among_equal_priorities_and_arrival_times_the_victim_is_the_last_added():
    # A burst: vLLM's arrival times are the wall clock at each add_request and never tie, so its victim among
    # equals is the last added; kvlab adds tied requests in request-id order (found against the real engine).
    sched = _scheduler(8, budget=64)
    for i in range(3):
        sched.add_request(_seq(i, 0.0, 8, 20, 0))
    _step(sched)
    out, _ = _step(sched)
    assert out.preempted_req_ids == (2,)


def test_fcfs_evicts_the_newest_on_the_same_requests():
    sched = _scheduler(8, budget=64, policy="fcfs")
    for seq in (_seq(0, 0.0, 8, 20, 1), _seq(1, 0.1, 8, 20, 2), _seq(2, 0.2, 8, 20, 0)):
        sched.add_request(seq)
    out, _ = _step(sched)
    assert out.new_req_ids == (0, 1, 2)
    out, _ = _step(sched)
    assert out.preempted_req_ids == (2,)
    assert out.num_scheduled_tokens == {0: 1, 1: 1}


def test_a_victim_scheduled_earlier_in_the_iteration_gives_its_tokens_back():
    # Request 0 (priority 9, the lowest) runs first in the batch and is scheduled; request 1 then finds no block,
    # and vLLM preempts request 0 although it already had its token this iteration: it is taken back (budget and
    # totals), and request 1 gets one of the blocks it freed. 5 usable blocks of 4 slots.
    sched = _scheduler(6, budget=64)
    sched.add_request(_seq(0, 0.0, 8, 20, 9))
    out, _ = _step(sched)
    assert out.num_scheduled_tokens == {0: 8} and sched.allocator.get_block_ids(0) == [1, 2]
    sched.add_request(_seq(1, 1.0, 7, 20, 0))
    out, _ = _step(sched)  # request 0's 9th token opens block 3; request 1's prompt takes 4 and 5
    assert out.new_req_ids == (1,) and out.num_scheduled_tokens == {0: 1, 1: 7}
    assert sched.allocator.get_block_ids(0) == [1, 2, 3] and sched.allocator.get_block_ids(1) == [4, 5]
    out, _ = _step(sched)  # both have room in their last blocks
    assert out.num_scheduled_tokens == {0: 1, 1: 1} and not out.preempted_req_ids
    assert sched.allocator.num_free_blocks == 0
    out, _ = _step(sched)  # request 0's 11th token fits; request 1's 9th needs a block: request 0 is the victim
    assert out.preempted_req_ids == (0,)
    assert out.num_scheduled_tokens == {1: 1}
    assert (out.num_prefill_tokens, out.num_decode_tokens) == (0, 1)
    assert out.num_context_tokens == 9 and out.num_attention_pairs == 9  # request 1's alone: 8 computed + 1
    assert sched.allocator.get_block_ids(1) == [4, 5, 3]  # (request 0's blocks came back tail first)
    assert [s.request_id for s in sched.running] == [1] and [s.request_id for s in sched.waiting] == [0]
    assert sched.num_resident_computed_tokens == 9  # (after the iteration: request 1's 9 tokens alone)


# -- on any input ------------------------------------------------------------------------------------------

requests_strategy = st.lists(
    st.tuples(st.floats(0, 5), st.integers(1, 40), st.integers(1, 30), st.integers(0, 3)), min_size=1, max_size=25)


def _run(cls, specs, num_blocks, budget, check: bool):
    sched = _scheduler(num_blocks, budget=budget, cls=cls)
    pending = sorted((Request(i, t, p, o, priority=pr) for i, (t, p, o, pr) in enumerate(specs)),
                     key=lambda r: (r.arrival_time, r.request_id))
    seqs = {r.request_id: Seq(r) for r in pending}
    step = 0
    while pending or sched.num_unfinished:
        while pending and (pending[0].arrival_time <= step * 0.1 or not sched.num_unfinished):
            sched.add_request(seqs[pending.pop(0).request_id])
        out = sched.schedule()
        sched.update_from_output(out, step * 0.1)
        step += 1
        assert step < 20_000
        if check:
            held = [b for s in sched.running for b in sched.allocator.get_block_ids(s.request_id)]
            assert len(held) == len(set(held)), "a block owned twice"
            assert len(held) + sched.allocator.num_free_blocks == num_blocks - 1, "a block lost"
            assert all(s.status is SeqStatus.RUNNING for s in sched.running)
            assert all(s.status in (SeqStatus.WAITING, SeqStatus.PREEMPTED) for s in sched.waiting)
    return seqs


@settings(max_examples=60, deadline=None)
@given(specs=requests_strategy, num_blocks=st.integers(20, 40), budget=st.integers(16, 64))
def test_every_request_finishes_and_no_block_is_lost_or_owned_twice(specs, num_blocks, budget):
    seqs = _run(Scheduler, specs, num_blocks, budget, check=True)
    for seq in seqs.values():
        assert seq.status is SeqStatus.FINISHED
        assert seq.num_output_tokens == seq.request.num_output_tokens


@settings(max_examples=60, deadline=None)
@given(specs=requests_strategy, num_blocks=st.integers(20, 40), budget=st.integers(16, 64))
def test_the_run_scheduler_stepping_is_the_reference(specs, num_blocks, budget):
    a = _run(Scheduler, specs, num_blocks, budget, check=False)
    b = _run(RunScheduler, specs, num_blocks, budget, check=False)
    for request_id, seq in a.items():
        other = b[request_id]
        assert (seq.first_token_time, seq.finish_time, seq.num_preemptions) == (
            other.first_token_time, other.finish_time, other.num_preemptions)


# -- the workload --------------------------------------------------------------------------------------------


def test_a_files_priority_column_travels_with_its_rows(tmp_path):
    from kvlab.workload import load_workload

    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,priority\n100,50,0.5,1\n80,20,0.1,0\n90,30,0.2,-2\n")
    assert [(r.prompt_len, r.priority) for r in load_workload(str(path)).requests] == [(80, 0), (90, -2), (100, 1)]
    jsonl = tmp_path / "w.jsonl"
    jsonl.write_text('{"prompt_len": 10, "output_len": 5, "priority": 3}\n{"prompt_len": 12, "output_len": 5, '
                     '"priority": 0}\n')
    drawn = load_workload(str(jsonl), rate=1.0, arrival="poisson", num_requests=6).requests  # (rows drawn anew)
    assert {(r.prompt_len, r.priority) for r in drawn} == {(10, 3), (12, 0)}


@pytest.mark.parametrize("rows, message", [
    ("100,50,0.5,high\n", "line 2: priority 'high' is not an integer"),
    ("100,50,0.5,1.5\n", "line 2: priority '1.5' is not an integer"),
    ("100,50,0.5,1\n80,20,0.6,\n", "line 3: priority is empty while other rows have one"),
])
def test_a_bad_priority_in_a_file_is_named_in_one_line(tmp_path, rows, message):
    from kvlab.errors import KvlabError
    from kvlab.workload import load_workload

    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,priority\n" + rows)
    with pytest.raises(KvlabError, match=re.escape(message)):
        load_workload(str(path))


def test_priority_classes_draw_each_request_by_their_shares_with_the_seed():
    from kvlab.workload import load_workload

    plain = load_workload("paper-sharegpt", num_requests=2000, rate=2.0, seed=4)
    drawn = load_workload("paper-sharegpt", num_requests=2000, rate=2.0, seed=4, priority_classes="0:0.25,7:0.75")
    assert [(r.prompt_len, r.arrival_time) for r in drawn.requests] == [
        (r.prompt_len, r.arrival_time) for r in plain.requests]  # (the classes come from a stream of their own)
    share = sum(r.priority == 0 for r in drawn.requests) / 2000
    assert {r.priority for r in drawn.requests} == {0, 7} and 0.22 < share < 0.28
    again = load_workload("paper-sharegpt", num_requests=2000, rate=2.0, seed=4, priority_classes="0:0.25,7:0.75")
    assert again.requests == drawn.requests


@pytest.mark.parametrize("text, message", [
    ("0:0.2,x:1", "priority 'x' is not an integer"),
    ("0", "'0' has no share"),
    ("0:0", "share '0' of priority 0 is not a number > 0"),
    ("1:1,1:2", "priority 1 appears twice"),
    ("0:0.2,1:0.7", "the shares sum to 0.9, not 1"),
])
def test_bad_priority_classes_are_named_in_one_line(kvlab, text, message):
    r = kvlab("run", "vllm", "-n", "10", "--priority-classes", text)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_high_priority_class_waits_less_than_a_low_one():
    from kvlab import service
    from kvlab.config import resolve

    def mean_wait(policy: str) -> dict[int, float]:
        config = resolve(model="opt-13b", num_requests=300, rate=20.0, seed=2, num_gpu_blocks=500,
                         scheduling_policy=policy, priority_classes="0:0.2,1:0.8")
        records = {r.request_id: r for r in service.run(config, ["vllm"]).results[0].records}
        waits: dict[int, list[float]] = {0: [], 1: []}
        for request in service.load(config).requests:
            record = records[request.request_id]
            waits[request.priority].append(record.first_token_time - record.arrival_time)
        return {p: sum(w) / len(w) for p, w in waits.items()}

    fcfs, priority = mean_wait("fcfs"), mean_wait("priority")
    assert priority[0] < fcfs[0] / 2 and priority[0] < priority[1]


def test_a_priority_is_read_as_an_exact_integer_and_a_json_boolean_is_named(tmp_path):
    from kvlab.errors import KvlabError
    from kvlab.workload.priority import parse_priority

    assert parse_priority("99999999999999999999999", "x") == 99999999999999999999999
    assert parse_priority(99999999999999999999999, "x") == 99999999999999999999999
    assert parse_priority("3.0", "x") == 3
    for written in ("1e3", "1_000", "+5"):  # (Python's int() or float() reads them; a file's number is digits)
        with pytest.raises(KvlabError, match=re.escape(f"x: priority {written!r} is not an integer")):
            parse_priority(written, "x")
    jsonl = tmp_path / "w.jsonl"
    jsonl.write_text('{"prompt_len": 10, "output_len": 5, "priority": true}\n')
    from kvlab.workload import load_workload

    with pytest.raises(KvlabError, match=re.escape("line 1: priority true is not an integer")):
        load_workload(str(jsonl))


def test_priority_classes_beside_a_files_priority_column_are_refused(tmp_path, kvlab):
    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,priority\n80,20,0.1,0\n100,50,0.5,1\n")  # (in order: no note)
    r = kvlab("run", "vllm", "--workload", str(path), "--priority-classes", "0:0.5,1:0.5")
    assert r.exit_code == 2 and "the workload file gives each request its own priority" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_timeout_for_a_class_the_workload_lacks_is_refused(kvlab):
    r = kvlab("run", "vllm", "-n", "20", "--priority-classes", "0:0.2,1:0.8", "--timeout", "0:5,2:10")
    assert r.exit_code == 2 and "no request has priority 2; valid: the workload's classes 0, 1" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, policies", [
    (("--scheduling-policy", "priority"), "--scheduling-policy priority orders"),
    (("--rate-limit", "5", "--gateway-queue", "10", "--gateway-queue-policy", "priority"),
     "--gateway-queue-policy priority orders"),
])
def test_a_priority_policy_over_one_class_is_said_to_order_nothing(kvlab, args, policies):
    """trial 51, finding 11: a priority policy on a workload whose requests are all class 0 ran silently, as fcfs."""
    r = kvlab("run", "vllm", "-n", "20", *args)
    assert r.exit_code == 0, r.stderr
    words = " ".join(r.stderr.split())
    assert (f"note: {policies} requests by their class, and every request of this workload is class 0: the order is "
            "first come, first served; give the classes with --priority-classes") in words
    with_classes = kvlab("run", "vllm", "-n", "20", *args, "--priority-classes", "0:0.2,1:0.8")
    assert with_classes.exit_code == 0 and "by their class" not in with_classes.stderr, with_classes.stderr
