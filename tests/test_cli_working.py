"""Long work a face waits on says so: a spinner on a terminal, one line on stderr otherwise (trial58: `kvlab vllm
compare` and `kvlab vllm calibrate` sat silent for minutes in a log)."""
from __future__ import annotations

from kvlab.cli.options import working


def test_off_a_terminal_long_work_says_what_it_runs_once_on_stderr(capsys):
    with working("Running 24 requests through the real vLLM engine"):
        print("the result")
    out, err = capsys.readouterr()
    assert err == "Running 24 requests through the real vLLM engine ...\n"
    assert out == "the result\n"
