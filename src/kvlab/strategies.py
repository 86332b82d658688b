"""Named serving strategies: a batching policy paired with a memory strategy (allocator), plus options.

Any ``BATCHING+ALLOCATOR`` pair is a strategy (``static+pow2``, ``continuous+oracle``, ...); options ride along
after more plus signs: ``+swap`` (swap preemption instead of recompute), ``+prefix`` (prefix caching, paged only).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from kvlab.errors import KvlabError

BATCHING_NAMES = ("static", "continuous")
ALLOCATOR_NAMES = ("max", "pow2", "oracle", "paged")
PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True, slots=True)
class Strategy:
    name: str
    batching: str
    allocator: str
    preemption_mode: str = "recompute"
    enable_prefix_caching: bool = False
    description: str = ""


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        # The lesson's race: the 2×2 of batching × memory.
        Strategy("static+max", "static", "max", description="request-level batches, each request reserves max_model_len"),
        Strategy("continuous+max", "continuous", "max", description="iteration-level batching, reserve max_model_len"),
        Strategy("static+paged", "static", "paged", description="request-level batches over 16-token pages"),
        Strategy("continuous+paged", "continuous", "paged", description="iteration-level batching over pages (= vLLM)"),
        # The vLLM paper's §6 baselines.
        Strategy("orca-max", "continuous", "max", description="Orca (Max): reserve up to max_model_len (2,048)"),
        Strategy("orca-pow2", "continuous", "pow2", description="Orca (Pow2): output space rounded up to a power of two"),
        Strategy("orca-oracle", "continuous", "oracle", description="Orca (Oracle): reserve exactly the true length"),
        Strategy("vllm", "continuous", "paged", description="vLLM: PagedAttention + continuous batching + recompute"),
    )
}

LESSON_RACE = ("static+max", "continuous+max", "static+paged", "continuous+paged")
PAPER_SYSTEMS = ("orca-max", "orca-pow2", "orca-oracle", "vllm")

_OPTIONS = {"swap": {"preemption_mode": "swap"}, "recompute": {"preemption_mode": "recompute"},
            "prefix": {"enable_prefix_caching": True}}


def parse_strategy(text: str) -> Strategy:
    """A named strategy, or ``BATCHING+ALLOCATOR[+OPTION...]``. Raises KvlabError naming what is valid."""
    name = text.strip().lower()
    if name in STRATEGIES:
        return STRATEGIES[name]
    head, *options = name.split("+")
    if head in STRATEGIES and all(o in _OPTIONS for o in options):
        base, rest = STRATEGIES[head], options
    elif head in BATCHING_NAMES and options and options[0] in ALLOCATOR_NAMES:
        base = Strategy(f"{head}+{options[0]}", head, options[0])
        rest = options[1:]
    else:
        valid = sorted(STRATEGIES) + [f"{b}+{a}" for b in BATCHING_NAMES for a in ALLOCATOR_NAMES]
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KvlabError(
            f"unknown strategy {text!r}.{hint} Valid: {', '.join(sorted(STRATEGIES))}, or BATCHING+ALLOCATOR "
            f"with BATCHING in {{{', '.join(BATCHING_NAMES)}}} and ALLOCATOR in {{{', '.join(ALLOCATOR_NAMES)}}}, "
            f"optionally +swap or +prefix."
        )
    strategy = base
    for option in rest:
        if option not in _OPTIONS:
            raise KvlabError(f"unknown strategy option {option!r} in {text!r}; valid options: {', '.join(_OPTIONS)}")
        strategy = replace(strategy, **_OPTIONS[option])
    if strategy.enable_prefix_caching and strategy.allocator != "paged":
        raise KvlabError(f"{text!r}: prefix caching needs paged memory (blocks can be shared; slabs cannot)")
    if strategy is not base or rest:
        strategy = replace(strategy, name=name)
    return strategy
