"""Fix 58b: trial 58's findings from a fresh clone (token slots beside vLLM's printed figure, a race's overload per
strategy, capacity's brackets, bench's --yes, unchecked architectures, fig12's counts, narrow progress lines, silent
flags, calibrate's table)."""

from __future__ import annotations

import pytest


def _flat(text: str) -> str:
    return " ".join(text.split())


# --- 1. a run's token slots beside vLLM's printed "GPU KV cache size" -------------------------------------------


@pytest.mark.parametrize(("model", "gpu", "printed", "blocks"), [
    ("mistral-7b-v0.1", "h100-sxm", "732,432", "28,633"), ("gemma-3-1b-it", "h200", "7,779,689", "1,991,931")])
def test_run_relates_its_slots_to_vllms_printed_figure(kvlab, model, gpu, printed, blocks):
    """`kvlab size` prints vLLM's "GPU KV cache size" (whole max_model_len requests' worth); a run counts the same
    blocks' tokens. The run's setup line says both count the same blocks and what each counts."""
    size = kvlab("size", model, "--gpu", gpu)
    assert f"GPU KV cache size: {printed} tokens" in size.stdout
    run = kvlab("run", "vllm", "--model", model, "--gpu", gpu, "-n", "20")
    assert run.exit_code == 0, run.stderr
    text = _flat(run.stdout)
    assert f'The same {blocks} blocks are vLLM\'s startup line "GPU KV cache size: {printed} tokens"' in text, text
    assert "max_model_len) requests" in text and "count each block's 16 tokens" in text


def test_run_says_nothing_where_the_figures_agree(kvlab):
    run = kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-n", "20")
    assert run.exit_code == 0 and "442,720 token slots" in run.stdout
    assert "GPU KV cache size" not in run.stdout


# --- 2. a race in which only some strategies are overloaded -----------------------------------------------------


def test_race_says_which_strategy_is_overloaded(kvlab):
    """orca-max falls behind at --rate 2 while vllm keeps up: the race says so of orca-max in run's words and that
    vllm's req/s is capped by the arrivals (before, nothing was said unless every strategy was overloaded)."""
    race = kvlab("race", "orca-max", "vllm", "--rate", "2", "-n", "2000")
    assert race.exit_code == 0, race.stderr
    text = _flat(race.stdout)
    alone = _flat(kvlab("run", "orca-max", "--rate", "2", "-n", "2000").stdout)
    said = text[text.index("orca-max is overloaded"):].split(" kvlab capacity")[0]
    assert said in alone, (said, alone)
    assert "vllm keeps up: its req/s is what arrived, capped by the arrivals" in text
    assert "vllm is overloaded" not in text and "Every strategy is overloaded" not in text


# --- 3. capacity's answer inside its own bracket ----------------------------------------------------------------


@pytest.mark.parametrize(("lo", "hi", "shown"), [(2.1875, 2.25, "2.18 [2.18, 2.25]"), (1.375, 1.4375, "1.37 [1.37, 1.44]"),
                                                 (0.3046875, 0.3125, "0.304 [0.304, 0.313]"),
                                                 (20.390625, 20.625, "20.3 [20.3, 20.7]"), (128.5, 131.25, "128 [128, 132]")])
def test_a_capacity_and_its_bracket_share_digits_and_rounding(lo, hi, shown):
    """The answer is rounded down to 3 significant digits; the bracket was printed to 4 (or 6) with %g, so the
    answer read below its own bracket. Now both to 3 digits, the held end down and the failed end up: the answer is
    the bracket's low end, and the bracket shown holds the one searched. fig12's table uses the same."""
    from kvlab.cli.paper import _bracket
    from kvlab.report.tables import bracket_text
    from kvlab.sweep.capacity import rate_text

    text = f"{rate_text(lo)} {bracket_text(lo, hi)}"
    assert text == shown
    low, high = (float(x) for x in text.split("[")[1].rstrip("]").split(", "))
    assert low <= float(rate_text(lo)) <= high and low <= lo and hi <= high
    assert _bracket({"error": None, "bracket": [lo, hi], "capacity_text": rate_text(lo), "capacity_rps": lo}) == shown


def test_a_bracket_without_an_end_says_so():
    from kvlab.report.tables import bracket_text

    assert bracket_text(None, 0.5) == "[–, 0.5]" and bracket_text(2.0, None) == "[2, –]"


# --- 6. fig12's progress and its end count the same points ------------------------------------------------------


def test_a_point_asked_for_again_is_counted_once():
    """fig12 asks for its searches' probes once more after the searches (already stored): the progress counted
    them again (its total past the points computed) while the end said "106 simulations computed". Each point is
    now counted once, in the progress and in the runner's total the end line reports."""
    import kvlab
    from kvlab.sweep.grid import expand, parse_cli_args, row_kinds
    from kvlab.sweep.runner import Runner
    from kvlab.sweep.store import Store
    from tests.test_sweep_run import InProcessPool

    seen = []
    store = Store(None, row_kinds())
    runner = Runner(store, InProcessPool(), kvlab.__version__, progress=lambda *args: seen.append(args))
    runner.in_rounds = True
    points = expand(parse_cli_args(["-n", "20", "--rate", "1,2", "--cost", "roofline"]))
    runner.run(points[:1])
    runner.run(points)  # (the first again, and a second)
    runner.run(points)  # (both again)
    store.close()
    assert runner.num_computed == 2 and runner.num_total_before == 2
    assert {total for *_, total, _ in seen} == {1, 2} and seen[-1][0] == seen[-1][3] == 2


# --- 5. a model_type kvlab has not checked ----------------------------------------------------------------------


def _weird(tmp_path, model_type="weirdarch"):
    import json

    fields = json.loads(open("tests/data/sizing_configs/mistral-7b-instruct-v0.2.json").read())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**fields, "model_type": model_type}))
    return path


@pytest.mark.parametrize("command", ["size", "fit"])
def test_an_unchecked_family_is_said_in_size_and_fit(kvlab, tmp_path, command):
    from kvlab.catalog.models import checked_model_types

    r = kvlab(command, _weird(tmp_path), "--gpu", "h100-sxm")
    assert r.exit_code == 0, r.stderr
    text = _flat(r.stdout)
    assert "model_type 'weirdarch' is none of the families kvlab has checked" in text
    assert ", ".join(checked_model_types()) in text and "Llama-style decoder" in text
    assert "gated MLP, no biases" in text and "heads" in text and "layers" in text
    assert {"llama", "mistral", "opt", "qwen3", "deepseek_v3"} <= set(checked_model_types())


def test_a_checked_family_gets_no_such_note(kvlab, tmp_path):
    r = kvlab("size", _weird(tmp_path, "mistral"), "--gpu", "h100-sxm")
    assert r.exit_code == 0 and "none of the families" not in r.stdout
    data = kvlab("size", _weird(tmp_path, "weirdarch"), "--gpu", "h100-sxm", "--json").json()
    assert any("weirdarch" in n for n in data["model_notes"])


# --- 8. options a run does not use, said -------------------------------------------------------------------------


def test_preemption_mode_on_a_reservation_scheme_is_noted(kvlab):
    r = kvlab("run", "orca-max", "--preemption-mode", "swap", "-n", "20")
    assert r.exit_code == 0, r.stderr
    assert "--preemption-mode swap does not change orca-max+swap" in _flat(r.stderr)
    assert "never preempts" in r.stderr
    paged = kvlab("run", "vllm-paper", "--preemption-mode", "swap", "-n", "20")
    assert "does not change" not in paged.stderr


def test_wide_with_json_is_noted(kvlab):
    r = kvlab("run", "vllm", "--json", "--wide", "-n", "20")
    assert r.exit_code == 0 and r.json()["strategies"]
    assert "--wide is not used with --json" in r.stderr
    assert "--wide" not in kvlab("run", "vllm", "--json", "-n", "20").stderr


# --- 7. capacity's progress lines within the terminal's width ---------------------------------------------------


def test_capacity_progress_lines_fit_80_columns(kvlab, tmp_path, monkeypatch):
    """A round's line was ~150 columns; at 80 it is wrapped, its further lines indented, and joined back it is the
    whole line (the round, the time so far, the rounds left and why, the time they take)."""
    import re

    monkeypatch.setenv("COLUMNS", "80")
    r = kvlab("capacity", "-n", "200", "--cost", "roofline", "--out", tmp_path)
    assert r.exit_code == 0, r.stderr
    progress = [line for line in r.stderr.splitlines() if line.startswith(("capacity search: round ", "  "))]
    assert progress and all(len(line) <= 80 for line in progress), progress
    joined = re.split(r"\n(?!  )", "\n".join(progress))
    rounds = [" ".join(part.split()) for part in joined]
    assert any(len(line) > 80 for line in rounds)  # (one at least needed the wrapping)
    pattern = (r"capacity search: round (\d+) done in [0-9hmins ]+; (about|at least) (\d+) more rounds?"
               r"( \(a search is still doubling or halving to its bracket\))?, ~[0-9hmins ]+ at this pace")
    assert all(re.fullmatch(pattern, line) for line in rounds), rounds


# --- 9. calibrate's table: readable units, whole names in 80 columns --------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [(4.717e-17, "≈ 0 ns (4.7e-17 s)"), (3.2e-9, "3.2 ns"),
                                              (2.5e-6, "2.5 µs"), (0.0177, "17.7 ms"), (0.0, "0 ms")])
def test_a_seconds_constant_has_a_readable_unit(value, shown):
    from kvlab.report.text import constant_text

    assert constant_text("overhead_s", value) == shown
    assert "e-" not in constant_text("overhead_s", value).split(" (")[0]


def test_the_constants_table_keeps_every_name_whole_in_80_columns():
    from rich.console import Console

    from kvlab.cost.profiles import ABSOLUTE_CONSTANTS
    from kvlab.report.text import constant_text, constants_table

    table = constants_table("Calibrated from 100 iterations")
    for name, meaning in ABSOLUTE_CONSTANTS.items():
        table.add_row(name, constant_text(name, 4.717e-17), constant_text(name, 1.234e-5), meaning)
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(table)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text and all(name in text for name in ABSOLUTE_CONSTANTS)


# --- extra: fig18b's notes (trial 58, finding 8) ----------------------------------------------------------------


def test_fig18b_says_each_note_once_within_80_columns(kvlab, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = kvlab("paper", "fig18b", "--block-sizes", "2,4,16", "--duration", "30", "--workers", "1", "--out", tmp_path)
    assert r.exit_code == 0, r.stderr
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout
    text = _flat(r.stdout)
    assert "Note:" not in text and text.count("note: --block-size") == 1
    assert "note: --block-size 2, 4: vLLM's CUDA attention backends take multiples of 16 and would refuse them" in text
    assert text.count("note: kvlab's cost model has no per-block kernel term") == 1


# --- extra: `kvlab vllm compare` says what it is doing before its wait (trial 58, finding 5) -------------------


def test_vllm_compare_says_what_it_runs_before_the_wait(kvlab, monkeypatch):
    from kvlab.errors import KvlabError
    from kvlab.vllm import compare as compare_module
    from kvlab.vllm import install

    def stop(*args, **kwargs):
        raise KvlabError("stopped here by the test")

    monkeypatch.setattr(install, "require_installed", lambda: None)
    monkeypatch.setattr(compare_module, "compare", stop)
    r = kvlab("vllm", "compare", "-n", "5")
    assert r.exit_code == 2 and "stopped here by the test" in r.stderr
    said = _flat(r.stderr)
    assert said.index("Running 5 requests through the real vLLM engine (its start alone takes about a minute) and "
                      "through kvlab ...") < said.index("stopped here")
    assert kvlab("vllm", "compare", "-n", "5", "--json").stdout == ""  # (the line is on stderr: stdout is the JSON's)
