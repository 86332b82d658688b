"""Named serving strategies: a batching policy paired with a memory strategy (allocator), plus options.

Any ``BATCHING+ALLOCATOR`` pair is a strategy (``static+pow2``, ``continuous+oracle``, ...); options ride along
after more plus signs: ``+swap`` (swap preemption instead of recompute), ``+recompute`` (the default, said
explicitly), ``+prefix`` (prefix caching, paged only), ``+noprefix`` (without it: ``vllm+noprefix`` is `vllm serve
--no-enable-prefix-caching`). A name always says what the strategy does: each option at most
once, one preemption mode, and ``--preemption-mode`` either agrees with the name or is added to it
(``with_preemption_mode``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any

from kvlab.errors import KvlabError

# The names of the parts; the engine's dispatch dicts (kvlab.sched.batching.BATCHING, kvlab.memory.ALLOCATORS,
# kvlab.sched.preemption.PREEMPTION) map exactly these to implementations (tests/test_config.py checks).
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
        # `vllm serve`'s defaults (vLLM V1, the version kvlab.vllm.install mirrors): prefix caching is on unless
        # --no-enable-prefix-caching (vllm/engine/arg_utils.py: EngineArgs.enable_prefix_caching resolves to True on
        # V1). The 2023 paper's vLLM had none: ``vllm-paper`` (on its single-turn workloads the two agree).
        Strategy("vllm", "continuous", "paged", enable_prefix_caching=True,
                 description="vLLM serve: PagedAttention + continuous batching + recompute + prefix caching"),
        Strategy("vllm-paper", "continuous", "paged",
                 description="vLLM as in the 2023 paper: PagedAttention + continuous batching, no prefix caching"),
    )
}

LESSON_RACE = ("static+max", "continuous+max", "static+paged", "continuous+paged")
PAPER_SYSTEMS = ("orca-max", "orca-pow2", "orca-oracle", "vllm-paper")  # (the 2023 paper: no prefix caching)

_OPTIONS: dict[str, dict[str, Any]] = {**{mode: {"preemption_mode": mode} for mode in PREEMPTION_MODES},
                                       "prefix": {"enable_prefix_caching": True},
                                       "noprefix": {"enable_prefix_caching": False}}


def parse_strategy(text: str) -> Strategy:
    """A named strategy, or ``BATCHING+ALLOCATOR[+OPTION...]``. Raises KvlabError naming what is valid."""
    name = text.strip().lower()
    if name in STRATEGIES:
        return STRATEGIES[name]
    head, *options = name.split("+")
    if head in STRATEGIES:
        base, rest = STRATEGIES[head], options
    elif head in BATCHING_NAMES and options and options[0] in ALLOCATOR_NAMES:
        base = Strategy(f"{head}+{options[0]}", head, options[0])
        rest = options[1:]
    else:
        valid = sorted(set(STRATEGIES) | {f"{b}+{a}" for b in BATCHING_NAMES for a in ALLOCATOR_NAMES})
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KvlabError(
            f"unknown strategy {text!r}.{hint} Valid: {', '.join(sorted(STRATEGIES))}, or BATCHING+ALLOCATOR "
            f"with BATCHING in {{{', '.join(BATCHING_NAMES)}}} and ALLOCATOR in {{{', '.join(ALLOCATOR_NAMES)}}}, "
            f"optionally +swap, +recompute, +prefix or +noprefix."
        )
    seen: dict[str, str] = {}
    for option in rest:
        if option not in _OPTIONS:
            raise KvlabError(f"unknown strategy option {option!r} in {text!r}; valid options: {', '.join(_OPTIONS)}")
        if option in seen:
            raise KvlabError(f"{text!r} names +{option} twice; valid: each option once, e.g. "
                             f"{'+'.join(dict.fromkeys(name.split('+')))}")
        key = "preemption" if option in PREEMPTION_MODES else "prefix" if option.endswith("prefix") else option
        if key in seen.values() and key == "preemption":
            raise KvlabError(f"{text!r} names two preemption modes; valid: one of +{' or +'.join(PREEMPTION_MODES)}")
        if key in seen.values() and key == "prefix":
            raise KvlabError(f"{text!r} names +prefix and +noprefix; valid: one of them")
        seen[option] = key
    strategy = base
    for option in rest:
        strategy = replace(strategy, **_OPTIONS[option])
    if strategy.enable_prefix_caching and strategy.allocator != "paged":
        raise KvlabError(f"{text!r}: prefix caching needs paged memory (blocks can be shared; slabs cannot)")
    if strategy is not base or rest:
        strategy = replace(strategy, name=name)
    return strategy


def check_preemption_mode(mode: str) -> None:
    if mode not in PREEMPTION_MODES:
        raise KvlabError(f"--preemption-mode {mode!r}; valid: {', '.join(PREEMPTION_MODES)}")


def strategy_names_help() -> str:
    """The named strategies and the pattern of the rest, for the command line's help."""
    return (f"Named strategies: {', '.join(STRATEGIES)}. Or BATCHING+ALLOCATOR ({'|'.join(BATCHING_NAMES)} + "
            f"{'|'.join(ALLOCATOR_NAMES)}), then +swap, +recompute, +prefix or +noprefix.")


def named_preemption_mode(strategy: Strategy) -> str | None:
    """The preemption mode a strategy's name states (+swap, +recompute), or None when it states none."""
    parts = strategy.name.split("+")
    stated = [mode for mode in PREEMPTION_MODES if mode in parts[1:]]
    return stated[0] if stated else None


def with_preemption_mode(strategy: Strategy, mode: str | None) -> Strategy:
    """The strategy under ``--preemption-mode``, named for what it does: a name that states another mode is refused,
    and a name that states none gains ``+swap`` when the mode differs from its own (recompute)."""
    if mode is None:
        return strategy
    check_preemption_mode(mode)
    stated = named_preemption_mode(strategy)
    if stated is not None and stated != mode:
        base = "+".join(p for p in strategy.name.split("+") if p != stated)
        raise KvlabError(f"strategy {strategy.name!r} {'swaps' if stated == 'swap' else 'recomputes'}; "
                         f"--preemption-mode {mode} contradicts its name; valid: drop --preemption-mode, or name "
                         f"the strategy {base}+{mode}")
    if mode == strategy.preemption_mode:
        return strategy
    return replace(strategy, name=f"{strategy.name}+{mode}", preemption_mode=mode)


def canonical_name(strategy: Strategy) -> str:
    """The strategy's name without the options that restate its base's (``vllm+prefix`` is ``vllm``,
    ``continuous+paged+recompute`` is ``continuous+paged``), the prefix option before the preemption mode (as
    ``with_preemption_mode`` adds it): one name for one strategy, however it was spelt."""
    head, *parts = strategy.name.split("+")
    if head in STRATEGIES:
        base = STRATEGIES[head]
    elif head in BATCHING_NAMES and parts and parts[0] in ALLOCATOR_NAMES:
        head, parts = f"{head}+{parts[0]}", parts[1:]
        base = Strategy(head, strategy.batching, strategy.allocator)
    else:
        return strategy.name
    options = []
    if strategy.enable_prefix_caching != base.enable_prefix_caching:
        options.append("prefix" if strategy.enable_prefix_caching else "noprefix")
    if strategy.preemption_mode != base.preemption_mode:
        options.append(strategy.preemption_mode)
    return "+".join([head, *options])


def behaviour(strategy: Strategy) -> tuple:
    """What a strategy does, whatever its name: two strategies with the same behaviour give the same results."""
    return (strategy.batching, strategy.allocator, strategy.preemption_mode, strategy.enable_prefix_caching)


def check_distinct(strategies: list[Strategy]) -> list[list[str]]:
    """Refuse a strategy given twice; return the groups of differently named strategies that behave the same
    (``vllm-paper`` and ``continuous+paged``), which a race reports as one result under two names."""
    names = [s.name for s in strategies]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise KvlabError(f"strategy {twice[0]!r} is given {names.count(twice[0])} times; a race compares distinct "
                         "strategies; valid: each name once")
    groups: dict[tuple, list[str]] = {}
    for s in strategies:
        groups.setdefault(behaviour(s), []).append(s.name)
    return [g for g in groups.values() if len(g) > 1]
