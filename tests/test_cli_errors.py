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
    (("run", "--nope"), ["error: no such option: --nope"]),
    (("vllm", "log"), ["error: missing argument 'FILE|-'", "kvlab vllm log --help"]),
    (("nope",), ["error: no such command 'nope'"]),
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


@pytest.mark.parametrize(("args", "says"), [
    (("run", "vllm", "--enable-chunked-prefill", "--no-enable-chunked-prefill"),
     "error: --enable-chunked-prefill and --no-enable-chunked-prefill are both given; valid: one of them"),
    (("run", "vllm", "-n", "5", "--num-requests=6"),
     "error: --num-requests is given 2 times (-n 5, --num-requests=6); valid: once (only the last would count)"),
    (("size", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpu", "a100"), "error: --gpu is given 2 times"),
    (("run", "-n5", "-n6"), "error: --num-requests is given 2 times (-n5, -n6)"),  # (trial 50c: -n5 is -n 5)
    (("size", "llama-3.1-8b", "-dcp", "2", "-dcp", "4"), "error: --dcp-size is given 2 times (-dcp 2, -dcp 4)"),
    (("capacity", "--slo", "p99_ttft<2s", "--slo", "p99_tpot<1s"),
     "valid: once, its terms in one comma list: --slo 'p99_ttft<2s,p99_tpot<100ms'"),
    (("run", "-n5", "--num-requests", "6"), "error: --num-requests is given 2 times (-n5, --num-requests 6)"),
    (("capacity", "--strategy", "vllm", "--rate", "1", "--rate", "2"),
     "error: --rate is given twice (--rate 1 and --rate 2); valid: once, with every value in one comma list"),
    (("sweep", "--enable-chunked-prefill", "--no-enable-chunked-prefill"),
     "valid: once, with --enable-chunked-prefill true,false for both"),
    (("capacity", "vllm"), "(a strategy here is an option: --strategy vllm; kvlab run and race take strategies as"),
    (("run", "--replicas", "auto"), "error: --replicas 'auto': not a whole number; valid: a whole number such as 16 "
                                    "(auto, the fewest replicas that sustain a rate, is kvlab capacity's alone, as "
                                    "the whole value: kvlab capacity --replicas auto --rate R)"),
    (("capacity", "--replicas", "many"), "error: --replicas 'many': not a whole number; valid: --replicas auto (the "
                                         "fewest that sustain --rate R), or a comma list of whole numbers, e.g. 16,32"),
    (("run", "vllm", "--html", "x.html"),
     "error: no such option: --html: it is an option of kvlab race, not of kvlab run (see 'kvlab run --help')"),
])
def test_an_option_given_twice_or_in_the_wrong_place_is_refused_before_any_work(args, says, tmp_path):
    """Trial 49: `--enable-chunked-prefill --no-enable-chunked-prefill` took the last silently; `run --html` was
    offered --help and --model; `capacity vllm` did not say strategies are --strategy there."""
    r = subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 2 and says in " ".join(r.stderr.split()), r.stderr
    assert not any(tmp_path.iterdir())  # (nothing written: refused before the sweep's store or a page)


def test_options_after_a_double_dash_are_not_counted():
    import typer.main

    from kvlab.cli import _check_repeats, _register
    from kvlab.cli.app import app

    _register()
    root = typer.main.get_command(app)
    _check_repeats(root, ["run", "vllm", "-n", "5", "--", "-n", "6"])
    _check_repeats(root, ["run", "vllm", "-n", "5", "--rate", "2"])


@pytest.mark.parametrize(("args", "says"), [
    # Trial 51: the first -n is --model's value (Click takes the next word): no repeat; trial 51b: the model '-n'
    # was refused as unknown, where the user forgot --model's value
    (("run", "--model", "-n", "-n", "5"), "error: --model needs a value: the word after it, -n, is an option of kvlab run"),
    # Trial 51: Click got '=5' from -n=5; the message showed '5'
    (("run", "-n=5"), "error: --num-requests/-n '=5': not a whole number; valid: a whole number such as 16 (a short "
                      "option takes its value as -n 5 or -n5, without '=')"),
])
def test_a_value_that_looks_like_an_option_is_read_as_click_reads_it(args, says):
    r = kvlab(*args)
    assert r.returncode == 2 and says in " ".join(r.stderr.split()), r.stderr


@pytest.mark.parametrize(("args", "says"), [
    # Trial 51: the hint named only kvlab vllm compare (a real engine); kvlab run's way is the strategy's name
    (("run", "--enable-prefix-caching"), "not of kvlab run; in kvlab run, prefix caching is part of the strategy's "
                                         "name: vllm has it on (as vllm serve), vllm+noprefix off, e.g. kvlab run "
                                         "vllm+noprefix"),
    # Trial 51: sweep and capacity take any run option through their grid parser, and were left out
    (("size", "llama-3.1-8b", "--rate", "2"), "kvlab run, kvlab sweep, kvlab bench, kvlab capacity,"),
    (("paper", "fig12", "-n", "5"), "kvlab run, kvlab sweep, kvlab bench, kvlab capacity,"),
])
def test_an_option_of_other_commands_names_every_owner_and_the_strategy_suffix(args, says):
    r = kvlab(*args)
    assert r.returncode == 2 and says in " ".join(r.stderr.split()), r.stderr


def test_the_strategy_names_the_prefix_hint_gives_are_strategies():
    from kvlab.cli import IN_THE_STRATEGY
    from kvlab.strategies import parse_strategy

    assert parse_strategy("vllm").enable_prefix_caching and not parse_strategy("vllm+noprefix").enable_prefix_caching
    assert "vllm+noprefix" in IN_THE_STRATEGY["--enable-prefix-caching"]


@pytest.mark.parametrize(("args", "says"), [
    (("run", "vllm", "-n", "5_0"), "error: --num-requests/-n '5_0': not written in digits; valid: 50"),
    (("run", "vllm", "-n", "+5"), "error: --num-requests/-n '+5': not written in digits; valid: 5"),
    (("run", "vllm", "-n", " 5"), "error: --num-requests/-n ' 5': not written in digits; valid: 5"),
    (("run", "vllm", "-n5_0"), "error: --num-requests/-n '5_0': not written in digits"),
    (("run", "vllm", "--num-gpu-blocks=1_000"), "error: --num-gpu-blocks '1_000': not written in digits; valid: 1000"),
    (("run", "vllm", "-n", "1e3"), "error: --num-requests/-n '1e3': not a whole number; valid: a whole number such as 16"),
    (("size", "opt-13b", "--concurrency", "1_6"), "error: --concurrency '1_6': not written in digits; valid: 16 (see 'kvlab size --help')"),
    (("lab", "--port", "+8000"), "error: --port '+8000': not written in digits; valid: 8000"),
])
def test_a_whole_number_option_takes_digits_only(args, says):
    """Trial 51: Click reads a whole number with int(), so `-n 5_0` ran 50 requests and `-n +5`, `-n ' 5'` ran,
    while `-n 1e3` was refused: each is refused now, in one line (kvlab.validate.whole_number_problem); trial 52 #13:
    '2_048' is not 'not a whole number' (int() reads it), it is not written in digits."""
    r = kvlab(*args)
    assert r.returncode == 2 and says in " ".join(r.stderr.split()) and len(r.stderr.splitlines()) == 1, r.stderr
