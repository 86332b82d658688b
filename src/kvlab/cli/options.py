"""The command line's flags, generated from the options' one declaration (kvlab/config/options.py), as vLLM's
``EngineArgs.add_cli_args`` generates its flags from its fields; and the few flags every command shares.

A command takes a set of declared options with ``@with_options(options_template(names))``: each becomes a
Typer option with the declared spelling (``--block-size``, ``-tp``), help and default; the command receives them
in its ``**options``. A face whose setup differs names its own defaults (``vllm compare``'s tiny engine), and the
help says them; the spelling and the check stay the option's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvlab.config.options import OPTIONS, Option

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
WideOpt = Annotated[bool, typer.Option("--wide", help="Every column of the table; the default fits 80 columns.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Go ahead with work beyond kvlab's limits (the refusal says "
                                      "what it would cost).")]


# The help's panels: one per part of the resolved configuration (kvlab/config/resolve.py).
PANELS = {"model": "Model", "device": "GPU", "parallel": "Parallelism and replicas", "router": "Router (a fleet)",
          "gateway": "Gateway (admission, docs/admission.md)",
          "cache": "KV cache", "scheduler": "Scheduler", "cost": "Clock (cost model)", "workload": "Workload",
          "sessions": "Sessions (--workload sessions)"}


def _help(option: Option, default: Any, default_text: str | None = None) -> str:
    text = option.help.replace("[", "\\[")
    stated = default_text or (option.default_text if default is None else "")
    if stated:
        text += f" \\[default: {stated}]"
    return text


def typer_parameter(option: Option, default: Any = inspect.Parameter.empty,
                    default_text: str | None = None) -> inspect.Parameter:
    """One declared option as a keyword parameter Typer reads: its annotation carries the flags and the help."""
    default = option.default if default is inspect.Parameter.empty else default
    if option.kind is bool:
        negative = "--no-" + option.flag.removeprefix("--")
        declaration = typer.Option(f"{option.flag}/{negative}", *option.aliases,
                                   help=_help(option, default, default_text), rich_help_panel=PANELS[option.group])
        annotation: Any = bool
    else:
        declaration = typer.Option(*option.flags, help=_help(option, default, default_text),
                                   show_default=default is not None and default_text is None,
                                   rich_help_panel=PANELS[option.group])
        annotation = Optional[option.kind] if default is None or option.optional else option.kind  # noqa: UP007
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, declaration])


def options_template(names: Sequence[str], defaults: dict[str, Any] | None = None,
                     default_texts: dict[str, str] | None = None, helps: dict[str, str] | None = None
                     ) -> Callable[..., None]:
    """A function whose signature declares the options ``names``, for ``with_options``. A face whose setup differs
    gives its own ``defaults`` and says them in ``default_texts`` (the help's "[default: ...]"); one that takes fewer
    of an option's values says which in ``helps`` (`kvlab size`'s --speculative-method)."""
    def template(**options: Any) -> None:
        """The options, declared once in kvlab/config/options.py."""

    defaults, texts, helps = defaults or {}, default_texts or {}, helps or {}
    params = [typer_parameter(replace(OPTIONS[name], help=helps[name]) if name in helps else OPTIONS[name],
                              defaults.get(name, inspect.Parameter.empty), texts.get(name))
              for name in names]
    template.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return template


def with_options(template: Callable[..., None]):
    """Give a command the options of ``template`` (a function whose signature declares them), so that options
    several commands share are declared once. The command receives them in its ``**options``."""
    shared = list(inspect.signature(template, eval_str=True).parameters.values())

    def decorate(command):
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        arguments = [p for p in own if p.default is inspect.Parameter.empty]
        rest = [p for p in own if p.default is not inspect.Parameter.empty]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in arguments + shared + rest]

        @functools.wraps(command)
        def wrapper(**kwargs):
            return command(**kwargs)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


# --- the flags of a sweep's session (kvlab.sweep.session): `kvlab sweep`, `kvlab capacity`, `kvlab paper` ----------
SWEEP_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
DEFAULT_OUT = Path("kvlab-sweep")
EXTRA_HELP = ("Any `kvlab run` option, with a comma list of values to sweep: --strategy vllm,orca-oracle "
              "--rate 1,2 --seed 0,1 --num-requests 300 ...")

GridOpt = Annotated[Path | None, typer.Option("--grid", help="A YAML or TOML file of options and lists "
                                                 "(docs/sweep.md); command-line lists override its keys.")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", help="Worker processes (or Ray CPUs) "
                                                   "\\[default: the number of cores].")]
RayOpt = Annotated[bool, typer.Option("--ray", help="Run the points as Ray tasks on a local Ray instance.")]
RayAddressOpt = Annotated[str | None, typer.Option("--ray-address", help="Run on an existing Ray cluster: "
                                                      "HOST:PORT, or auto for $RAY_ADDRESS.")]
OutOpt = Annotated[Path, typer.Option("--out", help="Folder of the sweep: its DuckDB store (sweep.duckdb, "
                                      "resumed when present) and plots.")]
SweepYesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Run even when the estimate exceeds --max-time.")]
MaxTimeOpt = Annotated[str, typer.Option("--max-time", help="Refuse (without --yes) a sweep estimated to take "
                                         "longer than this: 90s, 20m, 2h.")]
RetryOpt = Annotated[bool, typer.Option("--retry-failed", help="Compute again the points stored as failed.")]


# --- long work a face waits on ------------------------------------------------------------------------------------

def working(message: str):
    """While long work runs: a spinner on stderr when it is a terminal, else ``message`` once on stderr, so a log or
    a pipe does not sit silent for minutes (trial58: `kvlab vllm compare` and `vllm calibrate`)."""
    from contextlib import nullcontext

    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if console.is_terminal:
        return console.status(message, spinner="dots")
    console.print(f"{message} ...", soft_wrap=True)
    return nullcontext()


# --- --arrivals: an inference-perf configuration's draw (`kvlab run`, `kvlab race`) ---------------------------------
# (inference-perf's constant timer draws its arrivals, kvlab.workload.inference_perf.arrival_times; a replay draws them
# with seed 0 unless told; `kvlab calibrate --runs --arrivals SEEDS|even` pools several draws, a run replays one)
ArrivalsOpt = Annotated[Optional[str], typer.Option(  # noqa: UP007 (as typer_parameter's)
    "--arrivals", help="With an inference-perf configuration as --workload: its arrivals drawn as its constant timer "
    "draws them, with this seed, or 'even': evenly spaced at each stage's rate \\[default: 0].", show_default=False,
    rich_help_panel=PANELS["workload"])]
ARRIVALS_VALID = ("valid: --arrivals SEED (one seed of inference-perf's drawn arrivals, a whole number from 0; "
                  "default 0) or --arrivals even (evenly spaced at each stage's rate)")


def parse_arrival_seed(text: str) -> int | None:
    """--arrivals of a run: one seed, or None for 'even'; read by calibrate's parser (kvlab.cost.fit.parse_arrivals),
    which takes several to pool."""
    from kvlab.cost.fit import parse_arrivals
    from kvlab.errors import KvlabError

    try:
        seeds = parse_arrivals(text)
    except KvlabError:
        raise KvlabError(f"--arrivals {text!r} is not an arrival seed; {ARRIVALS_VALID}") from None
    if seeds is not None and len(seeds) != 1:
        raise KvlabError(f"--arrivals {text}: a run replays one draw, not {len(seeds)}; {ARRIVALS_VALID} (kvlab "
                         "calibrate --runs --arrivals pools several)")
    return None if seeds is None else seeds[0]


def with_arrivals(config, text: str | None):
    """``config`` with --arrivals put into its workload (WorkloadConfig.arrival_seed); refused in one line where the
    workload is not an inference-perf configuration replayed at its own times (a bundled source or a user's rows have
    no timer to draw with; --arrival poisson, gamma or burst draws new times for its rows)."""
    from kvlab.errors import KvlabError
    from kvlab.workload.inference_perf import SUFFIXES

    if text is None:
        return config
    seed = parse_arrival_seed(text)
    wl = config.workload
    if Path(wl.workload).suffix.lower() not in SUFFIXES:
        raise KvlabError(f"--arrivals {text}: workload {Path(wl.workload).name} is not an inference-perf configuration "
                         "(a .yaml file), whose constant timer --arrivals draws; valid: leave --arrivals out (--arrival "
                         "and --rate set other workloads' arrivals), or --workload CONFIG.yaml")
    if wl.arrival not in ("auto", "trace"):
        raise KvlabError(f"--arrivals {text} with --arrival {wl.arrival}: {wl.arrival} arrivals are drawn anew for the "
                         "configuration's rows, not at its own times; valid: one of the two")
    return replace(config, workload=replace(wl, arrival_seed=seed))
