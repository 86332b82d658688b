"""The `kvlab` command itself (a subprocess, as a user runs it): Click's own parse errors come out in kvlab's form."""

from __future__ import annotations

import subprocess
import sys

import pytest


def kvlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "says"), [
    (("run", "--rate", "abc"), ["error: --rate 'abc':", "not a number; valid: a number", "kvlab run --help"]),
    (("run", "--rate=abc"), ["error: --rate 'abc':", "not a number"]),
    (("race", "--max-num-seqs", "x"), ["error: --max-num-seqs 'x':", "not a whole number; valid: a whole number", "kvlab race --help"]),
    (("run", "--nope"), ["error: No such option: --nope"]),
    (("vllm", "log"), ["error: Missing argument 'FILE|-'", "kvlab vllm log --help"]),
    (("nope",), ["error: No such command 'nope'"]),
])
def test_a_parse_error_names_the_value_and_where_help_is(args, says):
    r = kvlab(*args)
    assert r.returncode == 2, r.stderr
    for text in says:
        assert text in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_help_and_a_bare_command_still_answer():
    assert kvlab("--help").returncode == 0
    bare = kvlab()
    assert "Usage: kvlab" in bare.stdout + bare.stderr and "error" not in bare.stderr


def test_version_and_the_short_help_option():
    import kvlab as package

    version = kvlab("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"kvlab {package.__version__}, engine: {package.engine()}"
    short, long = kvlab("run", "-h"), kvlab("run", "--help")
    assert short.returncode == long.returncode == 0 and short.stdout == long.stdout
