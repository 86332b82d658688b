"""``kvlab paper fig2``: the vLLM paper's Figure 2, from kvlab's simulator, next to the paper's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvlab.cli.app import app

paper_app = typer.Typer(help="The vLLM paper's experiments, rebuilt and compared with its figures.",
                        no_args_is_help=True)
app.add_typer(paper_app, name="paper")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


@paper_app.command("fig2")
def fig2(
    rate: Annotated[float, typer.Option("--rate", help="Poisson arrival rate, req/s (2: the right end of the "
                                        "paper's Figure 12a axis for this setup).")] = 2.0,
    cost: Annotated[str, typer.Option("--cost", help="Cost profile (kvlab cost) or file: the clock.")] = "paper-2023",
    num_requests: Annotated[int, typer.Option("--num-requests", "-n", help="Requests in the experiment.")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the workload.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write a PNG of kvlab's bars next to the "
                                                "paper's to this folder.")] = None,
) -> None:
    """Figure 2: where each system's KV memory goes (OPT-13B, A100-40GB, 12 GB of KV cache, ShareGPT, Poisson)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from kvlab.errors import KvlabError
    from kvlab.paper import PAPER_NAMES, Fig2Setup, fig2_json, run_fig2

    if rate <= 0:
        raise KvlabError(f"--rate must be positive, got {rate}")
    if num_requests < 1:
        raise KvlabError(f"--num-requests must be at least 1, got {num_requests}")
    setup = Fig2Setup(rate=rate, num_requests=num_requests, seed=seed, cost=cost)
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=as_json or not console.is_terminal) as progress:
        tasks: dict[str, int] = {}

        def update(system: str, done: int, total: int) -> None:
            if system not in tasks:
                tasks[system] = progress.add_task(system, total=total)
            progress.update(tasks[system], completed=done)

        rows = run_fig2(setup, progress=update)
    data = fig2_json(setup, rows)
    if out is not None:
        from kvlab.report.plots import plot_fig2

        out.mkdir(parents=True, exist_ok=True)
        plot_fig2(rows, out / "fig2.png")
        (out / "fig2.json").write_text(json.dumps(data, indent=2))
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(title="vLLM paper, Figure 2: share of KV memory (%), kvlab | paper", title_justify="left",
                  header_style="bold")
    for header in ("system", "token states", "reservation", "internal frag.", "external frag. & other",
                   "requests waiting", "req/s", "batch"):
        table.add_column(header, justify="left" if header == "system" else "right")
    for row in rows:
        cells = [f"{row.shares[k]:.1f} | {_pct(row.paper[k])}" for k in
                 ("token", "reserved", "internal_fragmentation", "external_fragmentation")]
        table.add_row(PAPER_NAMES[row.system], *cells, f"{100 * row.saturation:.0f}% of time",
                      f"{row.throughput_rps:.2f}", f"{row.mean_batch_size:.1f}")
    out_console = Console()
    if not out_console.is_terminal:
        out_console.width = max(out_console.width, 130)
    out_console.print(table)
    fastest = max(rows, key=lambda r: r.throughput_rps)
    out_console.print(
        f"Setup: OPT-13B on one A100-40GB with Table 1's 12 GiB of KV cache (15,728 slots), {setup.num_requests:,} "
        f"requests of the ShareGPT stand-in, Poisson at {setup.rate:g} req/s, seed {setup.seed}. "
        f"The paper's shares describe systems with a full cache and a queue: at this rate every system has requests "
        f"waiting most of the time (column 'requests waiting'). The knee: the most any system serves here is "
        f"{fastest.throughput_rps:.2f} req/s ({PAPER_NAMES[fastest.system]}: {fastest.mean_batch_size:.0f} requests "
        f"per iteration of {1000 * fastest.mean_iteration_s:.0f} ms on the clock of cost profile {setup.cost!r}: "
        f"the paper-era engine's, derived from the paper's Figure 12a and §7.1, see kvlab cost); below that rate "
        f"vLLM's cache is not full and its token share falls with the load. "
        f"docs/paper.md explains each difference from the paper.",
        highlight=False,
    )
    if out is not None:
        out_console.print(f"Wrote {out / 'fig2.png'} and {out / 'fig2.json'}", highlight=False)
