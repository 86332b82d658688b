"""kvlab capacity with client deadlines (--timeout): the answer bounds the share of clients that gave up
(``abandoned<5%``, kvlab.sweep.slo), its JSON carries that share and the wasted tokens, its table an abandoned
column; a share that cannot mean anything is one line, exit 2."""

from __future__ import annotations

import json

import pytest

# The progress lines on stderr (a round's line wrapped at the width, its further lines indented: fix 58b)
PROGRESS = ("points: ", "capacity search: round ", "  ")

DEADLINES = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--cost", "roofline", "--workload", "paper-sharegpt",
             "--num-gpu-blocks", "600", "--timeout", "10", "--workers", "1"]


def test_the_answer_bounds_the_abandoned_share_and_reports_it(kvlab, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    r = kvlab("capacity", *DEADLINES, "--slo", "p99_ttft<5s,abandoned<5%", "--out", tmp_path / "c", "--json")
    assert r.exit_code == 0, r.stderr
    (entry,) = json.loads(r.stdout)["capacities"]
    assert 0 <= entry["abandoned_share_at_capacity"] <= 0.05
    assert isinstance(entry["wasted_tokens_at_capacity"], int)
    for probe in entry["probes"]:
        share = probe["values"]["abandoned<5%"]
        assert probe["abandoned_share"] == share
        assert isinstance(probe["wasted_tokens"], int) and probe["wasted_tokens"] >= 0
        if probe["state"] == "stable":  # (a window that did not keep up fails on its state first)
            assert (share > 0.05) == (f"missed abandoned<5% ({share:.1%})" in probe["reason"])
    assert any("missed abandoned<5%" in p["reason"] for p in entry["probes"])
    table = kvlab("capacity", *DEADLINES, "--slo", "p99_ttft<5s,abandoned<5%", "--out", tmp_path / "c")
    assert any(line.split()[-3:] == ["abandoned", "by", "sims"] for line in table.stdout.splitlines()[:5]), table.stdout
    assert f"{entry['abandoned_share_at_capacity']:.1%}" in table.stdout
    # A target whose two samples disagree: the table shows the answer (the lower), with that sample's limit.
    tighter = kvlab("capacity", *DEADLINES, "--slo", "abandoned<1%", "--out", tmp_path / "c", "--json")
    (t,) = json.loads(tighter.stdout)["capacities"]
    assert t["samples"]["answer_rps"] == min(t["samples"]["capacities"])
    text = kvlab("capacity", *DEADLINES, "--slo", "abandoned<1%", "--out", tmp_path / "c").stdout
    row = next(line.split() for line in text.splitlines() if line.split()[:1] == ["vllm"])
    answer = " ".join(text.split()).split("vllm: ")[1].split(" req/s")[0]
    assert row[1] == answer and float(answer) == t["samples"]["answer_rps"], text


@pytest.mark.parametrize("slo, message", [
    ("p99_ttft<5s,abandoned<150%", "150% is not a share a client may give up at"),
    ("p99_ttft<5s,p99_abandoned<5%", "abandoned is the share of the window's requests whose client gave up, not a "
     "latency"),
])
def test_a_bad_share_is_one_line(kvlab, tmp_path, slo, message):
    r = kvlab("capacity", *DEADLINES, "--slo", slo, "--out", tmp_path / "c")
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_deadlines_shorter_than_the_answers_take_are_unreachable_at_any_rate(kvlab, tmp_path):
    args = [a if a != "10" else "1" for a in DEADLINES]  # (a 1 s deadline: ShareGPT's answers take longer)
    r = kvlab("capacity", *args, "--slo", "p99_ttft<5s,abandoned<5%", "--out", tmp_path / "c")
    errors = [line for line in r.stderr.splitlines() if not line.startswith(PROGRESS)]  # (progress lines aside)
    assert r.exit_code == 2 and len(errors) == 1
    assert "cannot be met at any rate: missed abandoned<5% (" in errors[0]
    assert "the clients' deadlines (--timeout) are shorter than their answers take with no queue" in errors[0]
