"""Grids of `kvlab run` options: comma lists and grid files into points, checked before anything runs.

A *point* is one simulation: every option of a run (the strategy included) with a value, defaults filled in.
Its identity is what it resolves to (kvlab/sweep/point.py: the resolved configuration's key and the strategy's
name), so two spellings of one point (``--rate 1`` and ``rate: 1.0`` in a file, ``--model OPT-13B`` and the
default) are one point.

The option names, their types and defaults are the run's options as declared once (kvlab/config/options.py),
so an option added there can be swept without a change here.

A grid file (YAML or TOML) maps option names to a value or a list of values (the cross product), and may hold
``points``: a list of option mappings, each combined with every point of the cross product (for options that
go together, such as a model and the GPU count it needs)::

    strategy: [vllm, orca-oracle]
    rate: [0.5, 1, 1.5, 2]
    num_requests: 500
    points:
      - {model: opt-13b, gpu: a100-40gb}
      - {model: opt-66b, gpu: a100-80gb, tensor_parallel_size: 4}
"""

from __future__ import annotations

import difflib
import itertools
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.validate import VLLM_HUMAN_READABLE_INT_ARGS, vllm_human_readable_int, whole_number_text

Point = dict[str, Any]  # option name -> value, every option of `kvlab run`


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option of a run, as the sweep sees it."""

    name: str  # the Python name: block_size
    flag: str  # the command line's: --block-size
    kind: str  # int, float, bool or str (the DuckDB column type follows it)
    default: Any
    aliases: tuple[str, ...] = ()  # other spellings: -n, -tp

    def convert(self, value: Any) -> Any:
        """The value a run gets for ``value`` (a string from the command line or a file's scalar), or the error
        its parser would give. (Ranges are checked when the point is resolved: one check, one message.)"""
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "")):
            if self.default is None or self.name == "preemption_mode":
                return None
            raise KvlabError(f"{self.flag} needs a value (it has no 'none'; its default is {self.default!r})")
        converted = _CONVERTERS[self.kind](value)
        if converted is None and self.name in VLLM_HUMAN_READABLE_INT_ARGS:  # (vLLM's 32k, 32K: as vllm serve reads)
            try:
                converted = vllm_human_readable_int(str(value))
            except ValueError as exc:
                raise KvlabError(f"{self.flag} {value!r}: {exc}") from None
        if converted is None:
            raise KvlabError(f"{self.flag} {value!r}: not {_KIND_NAMES[self.kind]}; valid: a comma list of "
                             f"{_EXAMPLES[self.kind]}" + auto_hint(self.name, value))
        if self.name in ("workload", "cost"):
            return _file_spec(self.name, str(converted))
        return converted


# The counts `kvlab capacity` can find itself (``auto``), and where to say so when a count does not parse.
AUTO_COUNTS = ("replicas", "prefill_replicas", "decode_replicas")
AUTO_HINT = (" (auto, the fewest replicas that sustain a rate, is kvlab capacity's alone, as the whole value: kvlab "
             "capacity --replicas auto --rate R)")
# a side's auto is asked beside the aggregated fleet's (docs/disaggregation.md; trial 59, finding 6)
SIDE_AUTO_HINT = (" (auto, the fewest replicas a side that sustain a rate, is kvlab capacity's alone, as the whole "
                  "value: kvlab capacity --replicas auto --{side}-replicas auto --rate R)")


def auto_hint(name: str, value: Any) -> str:
    """AUTO_HINT for a count that did not parse (``name``: its Python name) where the value was auto in any letters
    (auto, AUTO): where auto lives, without offering it here; '' for any other value or an option that has no auto.
    (`kvlab capacity` says its own for AUTO: cli.capacity._check_auto.)"""
    if name not in AUTO_COUNTS or not isinstance(value, str) or value.strip().lower() != "auto":
        return ""
    return AUTO_HINT if name == "replicas" else SIDE_AUTO_HINT.format(side=name.split("_")[0])


def _to_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    text = str(value).strip()  # (a list's spaces: "16, 32")
    return int(text) if whole_number_text(text) else None  # ('5_0', '+5' refused, as the CLI refuses them)


def _to_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(str(value).strip()) if not isinstance(value, (int, float)) else float(value)
    except ValueError:
        return None


def _to_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    return {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
            "off": False}.get(str(value).strip().lower())


_CONVERTERS = {"int": _to_int, "float": _to_float, "bool": _to_bool, "str": lambda v: str(v).strip()}
_KIND_NAMES = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string"}
_EXAMPLES = {"int": "whole numbers, e.g. 16,32", "float": "numbers, e.g. 1,1.5,2", "bool": "true and false",
             "str": "strings"}
_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


@cache
def run_options() -> dict[str, OptionSpec]:
    """The options a sweep can vary: the strategy (`kvlab run`'s argument, as ``--strategy``) and every option
    of a run, as declared in kvlab/config/options.py."""
    from kvlab.config.options import OPTIONS

    specs = {"strategy": OptionSpec("strategy", "--strategy", "str", "vllm")}
    for name, option in OPTIONS.items():
        specs[name] = OptionSpec(name, option.flag, _KINDS[option.kind], option.default, option.aliases)
    return specs


def row_kinds() -> dict[str, str]:
    """A stored point's columns and their kinds: the strategy, every option at its resolved value, and the numbers
    the resolved configuration derives (kvlab.config.resolve.DERIVED_FIELDS)."""
    from kvlab.config.resolve import DERIVED_FIELDS

    return {**{name: spec.kind for name, spec in run_options().items()},
            **{name: _KINDS[kind] for name, kind in DERIVED_FIELDS.items()}}


def _flag_names() -> dict[str, str]:
    """Every spelling a user may give an option -> its name (--block-size, block-size, block_size, -n)."""
    names: dict[str, str] = {}
    for spec in run_options().values():
        spellings = [spec.flag, spec.name, spec.name.replace("_", "-"), *spec.aliases]
        if spec.kind == "bool":
            spellings.append("--no-" + spec.flag.removeprefix("--"))
        for spelling in spellings:
            names[spelling] = spec.name
            names[spelling.lstrip("-")] = spec.name
    return names


def option_name(spelling: str) -> str:
    """The option a user meant by ``spelling``, or an error that says which options exist (did you mean?)."""
    names = _flag_names()
    if spelling in names:
        return names[spelling]
    flags = sorted({spec.flag for spec in run_options().values()})
    close = difflib.get_close_matches(spelling if spelling.startswith("-") else "--" + spelling.replace("_", "-"),
                                      flags, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    if spelling.lstrip("-").removeprefix("no-") == "enable-prefix-caching":  # (kvlab.strategies: +prefix, +noprefix)
        hint = ("prefix caching is part of the strategy's name: --strategy vllm has it on (as vllm serve), "
                "--strategy vllm+noprefix off; ")
    # (not "kvlab run has no option": a report's options, --slo-classes, --wide, --plots, are run's but no point's)
    raise UnknownGridOption(spelling, f"{spelling!r} is not an option a sweep or capacity search takes: {hint}the "
                            f"options they vary are {', '.join(flags)}")


class UnknownGridOption(KvlabError):
    """An option a sweep's or capacity's grid does not take (``spelling`` as given): the command line says which
    commands do take it, where some does (a report's --slo-classes, --wide: kvlab run's)."""

    def __init__(self, spelling: str, message: str):
        super().__init__(message)
        self.spelling = spelling


def parse_cli_args(args: list[str]) -> dict[str, list[Any]]:
    """``--rate 1,2 --seed=0,1 --no-enable-chunked-prefill`` -> {option: [values]} (values as given, strings)."""
    lists: dict[str, list[Any]] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            raise KvlabError(f"unexpected argument {token!r}: give options as --name VALUE[,VALUE...]"
                             + (f" (a strategy here is an option: --strategy {token}; kvlab run and race take "
                                "strategies as arguments)" if _is_strategy(token) else ""))
        flag, eq, value = token.partition("=")
        name = option_name(flag)
        spec = run_options()[name]
        if spec.kind == "bool" and not eq:
            # A flag alone: on, or off for its --no- spelling; it may also take a list: --enable-x true,false
            negative = flag.lstrip("-").startswith("no-")
            if i + 1 < len(args) and not args[i + 1].startswith("-") and not negative:
                value, i = args[i + 1], i + 1
            else:
                value = "false" if negative else "true"
        elif not eq:
            if i + 1 >= len(args):
                raise KvlabError(f"{flag} needs a value (or a comma list of values)")
            value, i = args[i + 1], i + 1
            if value.startswith("-") and value.split("=", 1)[0] in _flag_names():  # (--model -n 5: forgotten)
                raise KvlabError(f"{flag} needs a value: the word after it, {value}, is an option too; valid: "
                                 f"{flag} VALUE[,VALUE...] {value} ...")
        # (a set of router scorers is itself a comma list, prefix:2,least-kv:1: sets are separated by ";")
        values = value.split(LIST_SEPARATORS.get(name, ","))
        if any(not v.strip() for v in values):
            raise KvlabError(f"{flag} {value!r}: an empty value in the list (write none for an option's default)")
        if name in lists:
            both = f"{spec.flag} true,false for both" if spec.kind == "bool" else "every value in one comma list"
            raise KvlabError(f"{spec.flag} is given twice ({flag_text(spec.flag, lists[name])} and "
                             f"{flag_text(spec.flag, values)}); valid: once, with {both}")
        lists[name] = values
        i += 1
    return lists


# Options whose one value is a comma list, and what separates their values in a sweep's list instead.
LIST_SEPARATORS = {"router_scorers": ";"}


def flag_text(flag: str, values: list[str]) -> str:
    """An option as the user gave it: ``--rate 1,2``, ``--enable-chunked-prefill``, ``--no-enable-chunked-prefill``."""
    if values in (["true"], ["false"]) and flag.startswith("--enable-"):
        return flag if values == ["true"] else "--no-" + flag[2:]
    return f"{flag} {','.join(values)}"


def _is_strategy(token: str) -> bool:
    from kvlab.strategies import parse_strategy

    try:
        parse_strategy(token)
    except KvlabError:
        return False
    return True


def read_grid_file(path: Path) -> tuple[dict[str, list[Any]], list[dict[str, Any]]]:
    """A YAML or TOML grid file -> ({option: [values]}, [explicit point mappings])."""
    from kvlab.config.files import read_mapping

    data = read_mapping(path, "--grid", "a .yaml, .yml or .toml grid file (option: [values], and/or points:)")
    explicit = data.pop("points", None)
    if explicit is not None and (not isinstance(explicit, list) or not all(isinstance(p, dict) for p in explicit)):
        raise KvlabError(f"--grid {path}: 'points' must be a list of option mappings")
    if explicit == []:
        raise KvlabError(f"--grid {path}: 'points' is an empty list, which makes an empty grid")
    lists = {option_name(str(key)): list(value) if isinstance(value, list) else [value] for key, value in data.items()}
    points = [{option_name(str(key)): value for key, value in p.items()} for p in explicit or []]
    return lists, points


def expand(lists: dict[str, list[Any]], explicit: list[dict[str, Any]] | None = None) -> list[Point]:
    """The cross product of ``lists`` (combined with each explicit mapping), converted and with defaults filled
    in, in a stable order, duplicates removed."""
    specs = run_options()
    for name, values in lists.items():
        if not values:
            raise KvlabError(f"{specs[name].flag}: an empty list of values makes an empty grid")
        seen: dict[str, Any] = {}
        for value in values:  # (1,1 or 1,1.0: one point, not the two the list seems to ask for)
            key = canonical_json({"v": specs[name].convert(value)})
            if key in seen:
                raise KvlabError(f"{specs[name].flag} {','.join(str(v) for v in values)}: {value!r} is the same value "
                                 f"as {seen[key]!r}, given twice; valid: each value once")
            seen[key] = value
    names = list(lists)
    combos = [dict(zip(names, values)) for values in itertools.product(*(lists[n] for n in names))]
    if explicit:
        combos = [{**combo, **extra} for combo in combos for extra in explicit]
    points: dict[str, Point] = {}
    for combo in combos:
        point = {name: spec.default for name, spec in specs.items()}
        point.update({name: specs[name].convert(value) for name, value in combo.items()})
        point = _routed_alike(point, lists, set(combo) - {k for extra in explicit or () for k in extra})
        points.setdefault(canonical_json(point), point)
    if not points:
        raise KvlabError("the grid is empty: give at least one value for each option you vary")
    return list(points.values())


def _routed_alike(point: Point, lists: dict[str, list[Any]], from_lists: set[str]) -> Point:
    """A cross product's point whose router options route nothing, as the one point it is: with --replicas varied,
    one replica behind any router is the one engine (the router at its default); with --router varied, a router
    other than weighted takes no --router-scorers (at their default). Options a grid's explicit point sets, and a
    single value given for both, are left as given (resolve refuses them, naming the point)."""
    specs = run_options()
    one_engine = point["replicas"] == 1 and point["prefill_replicas"] is None and point["decode_replicas"] is None
    if one_engine and "router" in from_lists and len(lists.get("replicas", ())) > 1:
        point = {**point, "router": specs["router"].default, "router_scorers": specs["router_scorers"].default}
    if point["router"] != "weighted" and "router_scorers" in from_lists and len(lists.get("router", ())) > 1:
        point = {**point, "router_scorers": specs["router_scorers"].default}
    return point


def canonical_json(point: Point) -> str:
    return json.dumps(point, sort_keys=True, separators=(",", ":"))


# What a stored point holds; a store's points of an older format are computed again. 2: with its measured window;
# 3: served ÷ offered read from the latency's growth across the window (kvlab.window); 4: from the oldest wait's
# growth, the window up to the last arrival; 5: a request aborted at its client's deadline counted in the window's
# num_aborted and left out of its latencies, and a workload's request classes (kvlab.sweep.point).
POINT_FORMAT = 5


def point_key(config_key: str, strategy: str, version: str) -> str:
    """A point's identity in the store: what its options resolve to (the resolved configuration's key and the
    strategy's canonical name), the kvlab version that computes it and what a point stores."""
    import hashlib

    payload = canonical_json({"config": config_key, "strategy": strategy, "kvlab_version": version,
                              "format": POINT_FORMAT})
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _file_spec(name: str, spec: str) -> str:
    """A bundled workload or cost profile as named; a user's file as an absolute path (workers may run
    elsewhere: a Ray worker's working directory is not the user's)."""
    if name == "workload":
        from kvlab.workload import WORKLOADS

        known: set[str] = set(WORKLOADS)
    else:
        from kvlab.cost.profiles import builtin_profiles

        known = set(builtin_profiles())
    if spec in known:
        return spec
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec
