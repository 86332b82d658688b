"""kvlab's command line. ``main`` turns a user's mistake (KvlabError) into one red line and exit code 2."""

from __future__ import annotations

import importlib
import sys

from kvlab.cli.app import app

# One module per topic; each registers its commands on ``app`` when imported.
COMMAND_MODULES = ("catalog", "size", "sim", "paper", "lab", "vllm", "bench", "cost", "sweep")


def _register() -> None:
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(f"kvlab.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kvlab.cli.{name}":
                raise


def main(argv: list[str] | None = None) -> None:
    import typer.main

    from kvlab.errors import KvlabError

    _register()
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="kvlab")
    except KvlabError as exc:
        from rich.console import Console
        from rich.markup import escape

        # (escaped: a message may name `pip install 'kvlab[bench]'`, which is not markup)
        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)
