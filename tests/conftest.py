"""Shared test helpers."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The published traces' copies for tests and CI (kvlab ships none): ../shared/data/traces beside the repository,
# unless the command that runs the tests named a folder (scripts/test.sh sets the same one).
SHARED_TRACES = Path(os.environ.setdefault("KVLAB_TRACES_DIR", str(REPO.parent / "shared" / "data" / "traces")))


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def kvlab(capsys, monkeypatch):
    """Run ``kvlab ARGS...`` in-process, as the console script would; returns exit code and output."""
    from kvlab.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")

    def run(*args: str) -> CliResult:
        code = 0
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
