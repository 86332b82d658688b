"""A user's file's ``timeout`` column: each request's client deadline, seconds after its arrival (kvlab.workload
.files), carried with its row through the arrival sort, the redraw of a lengths-only file and conversations; used
as the request's deadline by the simulator; refused beside --timeout; one clear line for a bad cell."""

from __future__ import annotations

import re

import pytest

from kvlab.errors import KvlabError
from kvlab.workload import load_workload
from kvlab.workload.files import read_user_file


def test_the_timeout_column_travels_with_its_rows_in_arrival_order(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,timeout\n100,50,0.5,30\n80,20,0.1,2.5\n90,30,0.2,10\n")
    assert read_user_file(str(path)).timeout == (2.5, 10.0, 30.0)
    workload = load_workload(str(path))
    assert [(r.prompt_len, r.timeout) for r in workload.requests] == [(80, 2.5), (90, 10.0), (100, 30.0)]
    assert "Each client gives up after its request's own timeout (the file's timeout column)." in workload.description


def test_a_lengths_only_files_deadlines_are_redrawn_with_their_rows(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_len": 10, "output_len": 5, "timeout": 4}\n'
                    '{"prompt_len": 12, "output_len": 5, "timeout": 60}\n')
    drawn = load_workload(str(path), rate=1.0, arrival="poisson", num_requests=6).requests
    assert len(drawn) == 6 and {(r.prompt_len, r.timeout) for r in drawn} == {(10, 4.0), (12, 60.0)}


def test_a_conversations_turns_keep_their_own_deadlines(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("session_id,prompt_len,output_len,think_time,timeout\n0,100,20,0,5\n1,50,10,1,7\n0,180,20,3,9\n")
    assert [(r.prompt_len, r.timeout) for r in load_workload(str(path)).requests] == [(100, 5.0), (50, 7.0),
                                                                                       (180, 9.0)]


def test_an_empty_column_is_no_deadline(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,timeout\n100,50,0.5,\n80,20,0.1,\n")
    assert read_user_file(str(path)).timeout is None
    assert {r.timeout for r in load_workload(str(path)).requests} == {None}


def test_the_files_deadline_aborts_its_request(tmp_path):
    # Four long answers arriving at once on a tiny engine: the two with a 0.05 s deadline are aborted.
    from kvlab.config import resolve
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy

    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,timeout\n100,400,0,1000\n100,400,0,0.05\n100,400,0,1000\n"
                    "100,400,0,0.05\n")
    config = resolve(model="llama-2-7b", gpu="a100-80gb", num_gpu_blocks=100, max_model_len=2048).engine
    result = Simulation(parse_strategy("vllm"), config, load_workload(str(path))).run()
    assert [r.status for r in sorted(result.records, key=lambda r: r.request_id)] == [
        "finished", "aborted", "finished", "aborted"]
    summary = result.summary()
    assert summary["num_aborted"] == 2 and summary["abandoned_share"] == 0.5


@pytest.mark.parametrize("rows, message", [
    ("100,50,0.5,0\n", "line 2: timeout '0' is not a number of seconds > 0"),
    ("100,50,0.5,-1\n", "line 2: timeout '-1' is not a number of seconds > 0"),
    ("100,50,0.5,abc\n", "line 2: timeout 'abc' is not a number of seconds > 0"),
    ("100,50,0.5,inf\n", "line 2: timeout 'inf' is not a number of seconds > 0"),
    ("100,50,0.5,30\n80,20,0.6,\n", "line 3: timeout is empty while other rows have one; valid: seconds > 0 on every "
     "row, or on none"),
    ("100,50,0.5,\n80,20,0.6,30\n", "timeout is given on some rows only; valid: seconds > 0 on every row, or on none"),
])
def test_a_bad_timeout_in_a_file_is_named_in_one_line(tmp_path, rows, message):
    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,timeout\n" + rows)
    with pytest.raises(KvlabError, match=re.escape(message)) as error:
        load_workload(str(path))
    assert "\n" not in str(error.value)


def test_a_files_deadlines_and_the_timeout_option_are_refused_together(tmp_path, kvlab):
    path = tmp_path / "w.csv"
    path.write_text("prompt_len,output_len,arrival_time,timeout\n80,20,0.1,2.5\n100,50,0.5,30\n")  # (in order)
    with pytest.raises(KvlabError, match=re.escape(
            "--timeout 60: the workload file gives each request its own deadline (its timeout column); valid: one "
            "of the two, drop --timeout or the file's timeout column")):
        load_workload(str(path), timeout="60")
    r = kvlab("run", "vllm", "--workload", str(path), "--timeout", "60")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "its timeout column" in r.stderr
