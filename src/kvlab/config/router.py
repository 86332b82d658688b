"""A router as configured: its name, the weighted router's scorers, the random router's seed (kvlab.fleet runs it).

Parsed here, in the configuration, so that resolving ``--router`` never imports the fleet: kvlab.fleet.routers
maps each name in ROUTER_NAMES to its class and each name in SCORER_NAMES to its scorer (tests/test_fleet.py
holds the names and the dicts equal).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from kvlab.errors import KvlabError

ROUTER_NAMES = ("round-robin", "random", "least-requests", "least-kv", "prefix", "weighted")
SCORER_NAMES = ("prefix", "least-kv", "least-requests")
DEFAULT_SCORERS = "prefix:2,least-kv:1,least-requests:1"


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """A router as configured: its name, the weighted router's scorers, the random router's seed. ``text`` names it
    in reports and stores: ``weighted(prefix:2,least-kv:1)``. kvlab.fleet.routers.make_router builds one."""

    name: str
    scorers: tuple[tuple[str, float], ...] = ()
    seed: int = 0

    @property
    def text(self) -> str:
        if self.name != "weighted":
            return self.name
        return f"weighted({','.join(f'{name}:{weight:g}' for name, weight in self.scorers)})"


def parse_scorers(text: str) -> tuple[tuple[str, float], ...]:
    """``prefix:2,least-kv:1,least-requests:1`` -> ((name, weight), ...); a scorer without a weight weighs 1."""
    example = f"e.g. {DEFAULT_SCORERS!r}"
    if not text.strip():
        raise KvlabError(f"--router-scorers is empty; valid: NAME:WEIGHT pairs, {example}")
    scorers: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight_text = part.strip().partition(":")
        name = name.strip()
        if name not in SCORER_NAMES:
            raise KvlabError(f"unknown scorer {name!r} in --router-scorers {text!r}; valid: {', '.join(SCORER_NAMES)}")
        if name in scorers:
            raise KvlabError(f"scorer {name!r} is given twice in --router-scorers {text!r}; valid: each scorer once")
        try:
            weight = float(weight_text) if weight_text.strip() else 1.0
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight < 0:
            raise KvlabError(f"weight {weight_text.strip()!r} of scorer {name!r} in --router-scorers {text!r} is not "
                             "a finite number >= 0; valid: a weight such as 1, 2 or 0.5")
        scorers[name] = weight
    if not any(weight > 0 for weight in scorers.values()):
        raise KvlabError(f"--router-scorers {text!r} weighs every scorer 0; valid: at least one weight above 0")
    return tuple(scorers.items())


def parse_router(name: str, scorers: str | None = None, seed: int = 0) -> RouterSpec:
    """A router by name; ``scorers`` (``parse_scorers``' spelling) only for ``weighted``, which defaults to
    ``DEFAULT_SCORERS``. Raises KvlabError naming what is valid."""
    key = name.strip().lower()
    if key not in ROUTER_NAMES:
        close = difflib.get_close_matches(key, list(ROUTER_NAMES), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KvlabError(f"unknown router {name!r}{hint} (valid: {', '.join(ROUTER_NAMES)})")
    if scorers is not None and key != "weighted":
        raise KvlabError(f"--router-scorers applies only to --router weighted (--router is {key})")
    if key == "weighted":
        return RouterSpec(key, parse_scorers(DEFAULT_SCORERS if scorers is None else scorers))
    return RouterSpec(key, seed=seed if key == "random" else 0)
