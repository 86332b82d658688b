"""The Typer application every command module adds its commands to.

Each ``kvlab/cli/<topic>.py`` registers its own commands on ``app`` (or a sub-app); ``kvlab/cli/__init__.py``
imports them. Command modules import the heavy parts of kvlab inside the command functions, so that
``kvlab size`` starts fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="kvlab",
    help="Shows, measures and predicts why vLLM is fast: KV cache sizing, a serving simulator, a browser lab.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
