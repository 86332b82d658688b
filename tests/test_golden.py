"""One golden run per strategy: a fixed workload and seed, its summary pinned in tests/golden/.

A golden file is what kvlab computed when the behaviour was last checked by hand; a change to any number is a
change of behaviour that must be looked at. To accept one on purpose:
    KVLAB_REGEN_GOLDEN=1 python -m pytest tests/test_golden.py
and say why in the commit.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from kvlab.config import resolve
from kvlab.sim import Simulation
from kvlab.strategies import STRATEGIES, parse_strategy
from kvlab.workload import load_workload

GOLDEN = Path(__file__).with_name("golden")
NAMES = sorted(STRATEGIES) + ["vllm+swap", "continuous+pow2"]


@pytest.fixture(scope="module")
def setup():
    config = resolve(model="opt-13b", gpu="a100-40gb", available_kv_gib=12).engine
    workload = load_workload("paper-sharegpt", num_requests=300, rate=4.0, seed=0)
    return config, workload


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("name", NAMES)
def test_golden_run(name, setup):
    config, workload = setup
    summary = Simulation(parse_strategy(name), config, workload).run().summary()
    summary = json.loads(json.dumps(summary))  # as stored: tuples to lists, keys to strings
    path = GOLDEN / f"{name.replace('+', '_')}.json"
    if os.environ.get("KVLAB_REGEN_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    expected = json.loads(path.read_text())
    _close(summary, expected)
