"""`kvlab race`, `kvlab models` and `kvlab workloads` read in an 80-column terminal: no value is cut ("…"),
no line is wider than 80, every name is there whole; --wide shows every column. So does every command's
--help, with each option's name (and its --no- spelling) whole, and no value type shown for a flag."""

from __future__ import annotations

import re

import pytest


@pytest.fixture
def kvlab80(kvlab, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    return kvlab


def _check_fits(text: str) -> None:
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80, text


def _row(text: str, name: str) -> list[str]:
    """The cells of the table row that starts with ``name`` (the winner's row carries a ★)."""
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == name:
            return [c for c in cells[1:] if c != "★"]
    raise AssertionError(f"no row for {name!r} in\n{text}")


@pytest.mark.parametrize("strategies", [(), ("continuous+paged+swap+prefix", "static+max", "orca-oracle")])
def test_race_table_fits_80_columns_with_every_value_whole(kvlab80, strategies):
    r = kvlab80("race", *strategies, "-n", "120")
    assert r.exit_code == 0, r.stderr
    _check_fits(r.stdout)
    data = kvlab80("race", *strategies, "-n", "120", "--json").json()
    for s in data["strategies"]:
        cells = _row(r.stdout, s["name"])
        # The last two columns are always done and rejected; the second is the share of KV memory holding tokens.
        assert cells[-2:] == [f"{s['num_finished']:,}", f"{s['num_rejected']:,}"]
        assert cells[0] == f"{s['memory_shares']['token']:.1f}"
        assert f"{s['throughput_rps']:.3g}" in cells
    assert "normalized latency" in r.stdout  # the legend line


def test_race_times_carry_their_unit_in_the_header(kvlab80):
    r = kvlab80("race", "-n", "120")
    header = r.stdout[r.stdout.index("strategy") - 200:r.stdout.index("strategy") + 80]
    assert re.search(r"p50 (s|ms)\b", header) and re.search(r"(s|ms)/tok", header)


def test_race_wide_has_every_column(kvlab80):
    r = kvlab80("race", "-n", "120", "--wide")
    assert r.exit_code == 0, r.stderr
    assert "…" not in r.stdout
    for header in ("resv %", "frag %", "lat. p99", "TTFT", "recomp."):
        assert header in r.stdout


def test_rejections_are_printed_with_their_reason(kvlab80):
    r = kvlab80("race", "static+max", "vllm", "-n", "60", "--max-model-len", "256")
    assert r.exit_code == 0, r.stderr
    _check_fits(r.stdout)
    text = " ".join(r.stdout.split())
    assert "Rejected: " in text and "vllm " in text


def test_a_tie_is_a_tie_and_nobody_is_starred(kvlab80):
    r = kvlab80("race", "static+paged", "continuous+paged", "-n", "20", "--rate", "1e-6")
    assert r.exit_code == 0, r.stderr
    rows = [line for line in r.stdout.splitlines()  # (the table's rows, not a wrapped footnote's line)
            if line.startswith(("static+paged ", "continuous+paged ")) and len(line.split()) > 5]
    assert len(rows) == 2 and not any("★" in row for row in rows)
    assert "A tie" in r.stdout and "inf" not in r.stdout


def test_same_strategy_under_two_names_is_said(kvlab80):
    r = kvlab80("race", "vllm-paper", "continuous+paged", "-n", "60")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "vllm-paper and continuous+paged are the same strategy" in text
    # (their tie is their being one strategy, not memory that nobody competes for: trial 60, finding 4)
    assert "A tie: all 2 strategies served" in text and "do not compete for memory" not in text


def test_models_table_fits_80_columns(kvlab80):
    from kvlab.catalog import list_models

    r = kvlab80("models")
    assert r.exit_code == 0, r.stderr
    _check_fits(r.stdout)
    rows = {line.split()[0] for line in r.stdout.splitlines() if line.split()}
    for m in list_models():
        assert m.id in rows
        assert f"{m.kv_bytes_per_token(m.dtype_bytes):,}" in _row(r.stdout, m.id)


def test_gpus_table_fits_80_columns(kvlab80):
    from kvlab.catalog import list_gpus

    r = kvlab80("gpus")
    assert r.exit_code == 0, r.stderr
    _check_fits(r.stdout)
    for g in list_gpus():
        assert f"{g.memory_gib:.2f}" in _row(r.stdout, g.id)


def test_workloads_table_fits_80_columns(kvlab80):
    from kvlab.workload import list_workloads

    r = kvlab80("workloads")
    assert r.exit_code == 0, r.stderr
    _check_fits(r.stdout)
    for w in list_workloads():
        cells = _row(r.stdout, w.name)
        assert w.licence in cells and (w.mean_prompt_len is None or f"{w.mean_prompt_len:,.0f}" in cells)


def test_size_memory_split_reads_without_colour(kvlab80):
    r = kvlab80("size", "opt-13b", "--gpu", "a100-40gb")
    assert r.exit_code == 0, r.stderr
    assert "█" in r.stdout and "▓" in r.stdout and "░" in r.stdout and "█ weights" in r.stdout
    _check_fits(r.stdout)


def test_out_without_plots_writes_csv_and_json_in_one_naming_style(kvlab, tmp_path):
    r = kvlab("race", "static+max", "orca-max", "vllm+swap", "-n", "30", "--out", tmp_path / "out", "--no-plots")
    assert r.exit_code == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [".kvlab-written",  # (the files kvlab wrote there: what a later --out may write over)
                     "orca-max_iterations.csv", "orca-max_requests.csv", "static-max_iterations.csv",
                     "static-max_requests.csv", "summary.json", "vllm-swap_iterations.csv", "vllm-swap_requests.csv"]


@pytest.mark.parametrize("command", ["models", "workloads"])
def test_wide_catalogue_tables_show_every_column(kvlab80, command):
    """--wide in an 80-column terminal or pipe: every column whole, the lines as wide as they need (trial 47 #8)."""
    r = kvlab80(command, "--wide")
    assert r.exit_code == 0, r.stderr
    assert ("dtype" if command == "models" else "checksum sha256:") in r.stdout and "…" not in r.stdout


def _commands():
    """Every command path (``["run"]``, ``["vllm", "compare"]``, ...) and its click command."""
    import typer.main

    from kvlab.cli import _register
    from kvlab.cli.app import app

    _register()

    def walk(group, path):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, [*path, name])
            else:
                yield [*path, name], command

    return list(walk(typer.main.get_command(app), []))


@pytest.mark.parametrize("path", [" ".join(p) for p, _ in _commands()])
def test_every_commands_help_fits_80_columns_with_every_option_named_whole(kvlab80, path):
    command = dict((" ".join(p), c) for p, c in _commands())[path]
    r = kvlab80(*path.split(), "--help")
    assert r.exit_code == 0, r.stderr
    _check_fits(r.stdout)
    words = set(re.findall(r"--?[a-z][a-z0-9-]*", r.stdout))
    for param in command.params:
        for name in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if name.startswith("-"):
                assert name in words, f"{name} is not in `kvlab {path} --help`:\n{r.stdout}"
    assert "<bool>" not in r.stdout  # a flag takes no value


def test_capacity_help_names_the_aggregated_against_disaggregated_search(kvlab80):
    words = " ".join(kvlab80("capacity", "--help").stdout.replace("│", " ").split())
    assert "With --replicas auto --prefill-replicas auto --rate R: aggregated or disaggregated (xPyD)" in words


def test_the_readme_lists_every_document():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    for doc in sorted((root / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in readme, f"README's documentation list omits docs/{doc.name}"
