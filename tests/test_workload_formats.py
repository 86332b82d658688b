"""The formats people bring: lengths-only files (arrivals from --arrival at --rate), Vidur's and Sarathi-Serve's
num_prefill_tokens / num_decode_tokens CSVs, and Vidur's proportional clip to max_model_len beside rejection."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.workload import load_workload
from kvlab.workload.files import read_user_file
from kvlab.workload.load import _clip_to_max_model_len
from kvlab.workload.table import LengthTable


def test_a_lengths_only_file_gets_poisson_arrivals_at_the_rate(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_len,output_len\n" + "".join(f"{10 + i},{5 + i}\n" for i in range(50)))
    wl = load_workload(str(path), arrival="poisson", rate=5.0, num_requests=400, seed=1)
    times = np.array([r.arrival_time for r in wl.requests])
    assert wl.num_requests == 400 and np.all(np.diff(times) >= 0)
    assert 4.0 < 399 / times[-1] < 6.0  # the asked rate, within sampling noise
    assert {r.prompt_len for r in wl.requests} <= set(range(10, 60))
    gamma = load_workload(str(path), arrival="gamma", rate=5.0, cv=2.0, num_requests=50)
    assert gamma.num_requests == 50


def test_a_lengths_only_file_without_a_rate_says_to_give_one(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text('{"prompt_len": 10, "output_len": 5}\n' * 3)
    with pytest.raises(KvlabError, match="give --rate"):
        load_workload(str(path))
    with pytest.raises(KvlabError, match="no arrival times of its own"):
        load_workload(str(path), arrival="trace")


def test_a_row_with_more_fields_than_the_header_is_refused_not_cut(tmp_path):
    # "1,024,128" under prompt_len,output_len read as prompt 1, output 24 (128 dropped) would be a silent lie.
    path = tmp_path / "thousands.csv"
    path.write_text("prompt_len,output_len\n10,20\n1,024,128\n")
    with pytest.raises(KvlabError, match=r"thousands.csv, line 3: 3 fields under a header of 2 \('1,024,128'\)"):
        load_workload(str(path), rate=1.0)
    path.write_text("prompt_len,output_len,note\n10,20,first\n30,40\n")  # fewer fields, or extra columns: fine
    assert sorted(r.prompt_len for r in load_workload(str(path), rate=1.0).requests) == [10, 30]
    path.write_text("prompt_len,output_len,,\n10,20,,\n30,40,\n")  # a spreadsheet's trailing commas: fine
    assert sorted(r.prompt_len for r in load_workload(str(path), rate=1.0).requests) == [10, 30]


def test_a_byte_order_mark_is_read_and_a_misspelt_or_repeated_column_refused(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffprompt_len,output_len\n10,20\n".encode())  # Excel's "CSV UTF-8"
    assert [r.prompt_len for r in load_workload(str(path), rate=1.0).requests] == [10]
    path.write_text("arival_time,prompt_len,output_len\n0,10,20\n")
    with pytest.raises(KvlabError, match="column 'arival_time' would be ignored, .*; did you mean 'arrival_time'"):
        load_workload(str(path))
    path.write_text("prompt_len,output_len,prompt_len\n10,20,3\n")
    with pytest.raises(KvlabError, match="column 'prompt_len' appears twice"):
        load_workload(str(path), rate=1.0)
    path.write_text("prompt_len,output_len,prompt_length\n10,20,3\n")  # a column of its own beside prompt_len
    assert [r.prompt_len for r in load_workload(str(path), rate=1.0).requests] == [10]
    jsonl = tmp_path / "typo.jsonl"
    jsonl.write_text('{"prompt_len": 10, "output_len": 5, "max_token": 4}\n')
    with pytest.raises(KvlabError, match="typo.jsonl, line 1: column 'max_token' .* did you mean 'max_tokens'"):
        load_workload(str(jsonl), rate=1.0)


def test_vidur_and_sarathi_columns_are_read(tmp_path):
    path = tmp_path / "vidur.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n74,918,992,0.08\n290,905,1195,0.32\n")
    wl = load_workload(str(path), arrival="burst", num_requests=2)
    assert sorted((r.prompt_len, r.output_len) for r in wl.requests) == [(74, 918), (290, 905)]
    timed = tmp_path / "vidur_trace.csv"
    timed.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,4\n0.1,20,3\n")
    assert [(r.arrival_time, r.prompt_len) for r in load_workload(str(timed)).requests] == [(0.1, 20), (0.5, 10)]


def test_the_cli_serves_a_lengths_only_file_at_the_default_rate(kvlab, tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" + "100,50\n" * 30)
    r = kvlab("run", "vllm", "--workload", path, "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["workload"]["num_requests"] == 30 and data["strategies"][0]["num_finished"] == 30


def test_vidur_clip_scales_prompt_and_output_together():
    table = LengthTable(prompt_len=np.array([1500, 100, 3000]), output_len=np.array([1500, 50, 1]))
    clipped, num = _clip_to_max_model_len(table, 2048)
    assert num == 2
    assert (clipped.prompt_len.tolist(), clipped.output_len.tolist()) == ([1024, 100, 2047], [1024, 50, 1])
    assert np.all(clipped.prompt_len + clipped.output_len <= 2048)


def test_clip_serves_what_reject_refuses(kvlab, tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "".join(f"{i * 0.1},3000,100\n" for i in range(5)))
    rejected = kvlab("run", "vllm", "--workload", path, "--json").json()["strategies"][0]
    assert rejected["num_rejected"] == 5
    r = kvlab("run", "vllm", "--workload", path, "--long-requests", "clip", "--json")
    assert r.exit_code == 0, r.stderr
    clipped = r.json()
    assert clipped["strategies"][0]["num_finished"] == 5 and clipped["strategies"][0]["num_rejected"] == 0
    assert "5 requests longer than max_model_len 2,048 clipped" in clipped["workload"]["description"]


def test_a_users_jsonl_in_the_mooncake_layout_is_read_as_mooncake(tmp_path):
    source = Path(os.environ["KVLAB_TRACES_DIR"]) / "mooncake_fast25_conversation_trace.jsonl"
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(source.read_text().splitlines(keepends=True)[:3]))
    rows = [json.loads(line) for line in mine.read_text().splitlines()]
    requests = load_workload(str(mine)).requests  # (it said: column 'output_length' is not one kvlab reads)
    assert sorted(r.prompt_len for r in requests) == sorted(row["input_length"] for row in rows)
    assert sorted(r.output_len for r in requests) == sorted(row["output_length"] for row in rows)
    mine.write_text('{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": [0]}\n')
    with pytest.raises(KvlabError, match=r"mine.jsonl, line 1: input_length 0 "):
        load_workload(str(mine))
    mine.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'
                    '{"timestamp": 1, "input_length": 10, "output_length": 5}\n')
    with pytest.raises(KvlabError, match="line 2: no key 'hash_ids'"):
        load_workload(str(mine))


def test_a_misspelt_column_is_not_called_both_unread_and_ignored(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt_len": 10, "output_length": 5}\n')
    with pytest.raises(KvlabError) as error:
        load_workload(str(path), rate=1.0)
    message = str(error.value)
    assert "did you mean 'output_len'" in message and "not one kvlab reads" not in message
    assert "other columns are ignored" not in message


def test_a_mooncake_layout_without_hash_ids_is_told_it_lacks_them(tmp_path):
    """Trial 49: it was told output_length would be ignored (a misspelling of output_len), then given the Mooncake
    columns, output_length among them, as the ones kvlab reads."""
    path = tmp_path / "t_broken.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 100, "output_length": 20}\n')
    with pytest.raises(KvlabError) as error:
        load_workload(str(path))
    message = str(error.value)
    assert message.startswith(f"{path}, line 1: a Mooncake-layout row (it has timestamp, input_length, output_length) "
                              "lacks hash_ids; valid: a Mooncake trace's timestamp, input_length, output_length, "
                              "hash_ids on every row")
    assert "would be ignored" not in message


def test_a_users_rows_out_of_order_are_counted_and_sorted(tmp_path):
    path = tmp_path / "u.csv"
    path.write_text("arrival_time,prompt_len,output_len\n0,10,5\n2,11,5\n1,12,5\n3,13,5\n0.5,14,5\n")
    from kvlab.workload.files import read_user_file

    table = read_user_file(str(path))
    assert table.num_out_of_order == 2
    assert table.prompt_len.tolist() == [10, 14, 12, 11, 13]
    assert "run in arrival order (2 of the file's rows" in load_workload(str(path)).description


@pytest.mark.parametrize("name, text, message", [
    ("a.csv", "arrival_time,prompt_len,output_len\n0,5_0,10\n", "a.csv, line 2: prompt_len '5_0' is not a whole "
     "number written in digits"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0,50,1e1\n", "output_len '1e1' is not a whole number written"),
    ("a.csv", "arrival_time,prompt_len,output_len\n0_5,50,10\n", "a.csv, line 2: arrival_time '0_5' is not a number "
     "written in digits (such as 12, 0.5 or 1.5e-3)"),
    ("a.jsonl", '{"prompt_len": "+50", "output_len": 10}\n', "a.jsonl, line 1: prompt_len '+50' is not a whole"),
    ("a.csv", "prompt_len,output_len,max_tokens\n50,10,2_0\n", "line 2: max_tokens '2_0' is not a whole number"),
    ("a.csv", "prompt_len,output_len,session_id,think_time\n50,10,1_0,0\n", "line 2: session_id '1_0' is not a whole"),
    ("a.csv", "prompt_len,output_len,session_id,think_time\n50,10,1,1_0\n", "line 2: think_time '1_0' is not a finite"),
    ("a.csv", "prompt_len,output_len,priority\n50,10,1_0\n", "line 2: priority '1_0' is not an integer"),
    ("a.csv", "prompt_len,output_len,timeout\n50,10,3_0\n", "line 2: timeout '3_0' is not a number of seconds"),
])
def test_a_number_in_a_file_is_written_in_digits_not_as_python_reads_one(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(KvlabError, match=re.escape(message)):
        read_user_file(str(path))


def test_a_file_number_written_as_a_spreadsheet_writes_one_is_still_read(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("arrival_time,prompt_len,output_len,priority\n 1.5e-1, 50.0 ,10,-3\n0,20,7,99999999999999999999999\n")
    table = read_user_file(str(path))
    assert table.prompt_len.tolist() == [20, 50] and table.arrival_time.tolist() == [0.0, 0.15]
    assert table.priority == (99999999999999999999999, -3)
