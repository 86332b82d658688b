"""Which engine runs: the pure-Python sources, or the same sources compiled with mypyc (setup.py, issue 34).

``kvlab.engine()`` names it and ``kvlab --version`` prints it; an install is never half compiled. The golden
runs (tests/test_golden.py) and runs = stepping (tests/test_runs.py) run on whichever engine is installed: the
test command runs the whole suite on the pure-Python engine, then (scripts/test_compiled.sh) builds the compiled one
and runs these, the fleet's reads and the real-engine comparison on it. A run that installed
one engine on purpose says which with KVLAB_EXPECT_ENGINE=compiled or =pure, and fails if it got the other (a
compile that fell back)."""

from __future__ import annotations

import os

import pytest

import kvlab


def test_the_engine_is_one_or_the_other():
    assert kvlab.engine() in ("compiled (mypyc)", "pure Python")


def test_the_compiled_modules_are_those_setup_py_compiles():
    assert _setup_engine_list() == list(kvlab.COMPILED_MODULES)


@pytest.mark.skipif(not os.environ.get("KVLAB_EXPECT_ENGINE"), reason="KVLAB_EXPECT_ENGINE not set")
def test_the_engine_installed_is_the_one_asked_for():
    expected = {"compiled": "compiled (mypyc)", "pure": "pure Python"}[os.environ["KVLAB_EXPECT_ENGINE"]]
    assert kvlab.engine() == expected


def _setup_engine_list() -> list[str]:
    """setup.py's ENGINE, read without running setup() (the file is beside tests/ in a checkout)."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[1] / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ENGINE":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ENGINE list")
