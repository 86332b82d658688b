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


def test_a_groups_list_of_commands_gives_each_summary_as_one_line(kvlab):
    """trial58: the list kept the docstring's line breaks and cut a sentence ("its licence / and citation")."""
    r = kvlab("workloads", "--help")
    line = next(x for x in r.stdout.splitlines() if x.lstrip("│ ").startswith("fetch "))
    assert "check its checksum, and print its licence and citation." in line
