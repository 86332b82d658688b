"""How far kvlab's estimated KV cache budget was from vLLM's on the corpus of real startup logs, as
benchmarks/startup_logs.py's summary computes it and `--write` stores it (data/sizing_accuracy.json): what
`kvlab size` and `kvlab fit` say beside a budget that is kvlab's estimate. Regenerate it after changing the sizing
or the corpus: ``python benchmarks/startup_logs.py --write`` (tests/test_trial53c.py checks it is current)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def kv_token_accuracy() -> dict | None:
    """The stored summary (num_sized, num_within, within, median_abs_error, largest_error, num_logs, command); None
    where the file is absent."""
    path = resources.files("kvlab.catalog").joinpath("data/sizing_accuracy.json")
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def estimate_accuracy_clause() -> str | None:
    """One clause: how far the estimate was off on the corpus ("on 40 real startup logs kvlab sizes, its KV cache
    tokens were within 2% of vLLM's on 25, median error 1.2%, largest +33.3%"); None where nothing is stored."""
    acc = kv_token_accuracy()
    if not acc or not acc.get("num_sized"):
        return None
    return (f"on {acc['num_sized']} real startup logs kvlab sizes, its KV cache tokens were within "
            f"{acc['within']:.0%} of vLLM's on {acc['num_within']}, median error {acc['median_abs_error']:.1%}, "
            f"largest {acc['largest_error']:+.1%} (benchmarks/startup_logs.py)")
