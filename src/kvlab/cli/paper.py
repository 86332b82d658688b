"""``kvlab paper fig2``: the vLLM paper's Figure 2, from kvlab's simulator, next to the paper's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

import kvlab
from kvlab.cli.app import app
from kvlab.cli.options import JsonOpt, RayAddressOpt, RayOpt, WorkersOpt
from kvlab.errors import KvlabError
from kvlab.report.text import plural
from kvlab.sizing import cuda_block_size_note
from kvlab.validate import allow_large_work, check_output_path, note_written

# What each figure writes into --out (fig12 and fig18b beside their sweep store).
FIG2_FILES = ("fig2.png", "fig2.json")
FIG12_FILES = ("fig12.png", "fig12_capacity.png", "fig12.html", "fig12.json")
FIG18B_FILES = ("fig18b.png", "fig18b.json")

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
    as_json: JsonOpt = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write a PNG of kvlab's bars next to the "
                                                "paper's to this folder.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Go ahead with work beyond kvlab's limits.")] = False,
) -> None:
    """Figure 2: where each system's KV memory goes (OPT-13B, A100-40GB, 12 GiB of KV cache, ShareGPT, Poisson)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table


    check_output_path(out, "--out", folder=True, writes=FIG2_FILES)
    from kvlab.paper import PAPER_NAMES, Fig2Setup, fig2_json, run_fig2
    setup = Fig2Setup(rate=rate, num_requests=num_requests, seed=seed, cost=cost)
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=as_json or not console.is_terminal) as progress:
        tasks: dict[str, int] = {}

        def update(system: str, done: int, total: int) -> None:
            if system not in tasks:
                tasks[system] = progress.add_task(system, total=total)
            progress.update(tasks[system], completed=done)

        with allow_large_work(yes):  # (the run service checks every option and the work before it starts)
            rows = run_fig2(setup, progress=update)
    data = fig2_json(setup, rows)
    if out is not None:
        from kvlab.report.plots import plot_fig2

        out.mkdir(parents=True, exist_ok=True)
        png, data_json = (out / name for name in FIG2_FILES)
        plot_fig2(rows, png)
        data_json.write_text(json.dumps(data, indent=2))
        note_written(out, [png, data_json])
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    # (Fits 80 columns: short headers, explained in the legend below.)
    table = Table(title="vLLM paper, Figure 2: share of KV memory (%), kvlab|paper", title_justify="left",
                  header_style="bold underline", box=None, pad_edge=False)
    for header in ("system", "tokens", "reserved", "internal", "external", "wait", "req/s", "batch"):
        table.add_column(header, justify="left" if header == "system" else "right")
    for row in rows:
        cells = [f"{row.shares[k]:.1f}|{_pct(row.paper[k])}" for k in
                 ("token", "reserved", "internal_fragmentation", "external_fragmentation")]
        table.add_row(PAPER_NAMES[row.system], *cells, f"{100 * row.saturation:.0f}%",
                      f"{row.throughput_rps:.2f}", f"{row.mean_batch_size:.1f}")
    out_console = Console()
    out_console.print(table)
    out_console.print("tokens: slots holding computed tokens; reserved: held for tokens still to come; internal: "
                      "reserved, never to be used; external: free or lost to the allocator (the paper's 'external "
                      "fragmentation & other'); wait: share of time with requests queued; batch: mean requests "
                      "per iteration.", highlight=False)
    out_console.print(_fig2_setup_text(setup, rows), highlight=False)
    if out is not None:
        out_console.print(f"Wrote {out / 'fig2.png'} and {out / 'fig2.json'}", highlight=False)


def _fig2_setup_text(setup, rows) -> str:
    """The setup, whether the paper's premise (a full cache and a queue) held, and where the knee is."""
    from kvlab.paper import PAPER_NAMES

    fastest = max(rows, key=lambda r: r.throughput_rps)
    idle = [PAPER_NAMES[r.system] for r in rows if r.saturation < 0.5]
    premise = ("at this rate every system has requests waiting most of the time (column 'wait')" if not idle else
               f"here {', '.join(idle)} had requests waiting less than half the time (column 'wait'), so "
               f"{'its' if len(idle) == 1 else 'their'} shares are not the paper's situation: give more requests "
               f"(-n) or a higher --rate")
    return (
        f"Setup: OPT-13B on one A100-40GB with Table 1's 12 GiB of KV cache (15,728 slots), "
        f"{plural(setup.num_requests, 'request')} of the ShareGPT stand-in, Poisson at {setup.rate:g} req/s, seed "
        f"{setup.seed}. The paper's shares describe systems with a full cache and a queue: {premise}. The knee: the "
        f"most any system serves here is {fastest.throughput_rps:.2f} req/s ({PAPER_NAMES[fastest.system]}: "
        f"{plural(round(fastest.mean_batch_size), 'request')} per iteration of {1000 * fastest.mean_iteration_s:.0f} "
        f"ms on the clock of cost profile {setup.cost!r}: "
        f"the paper-era engine's, derived from the paper's Figure 12a and §7.1, see kvlab cost); below that rate "
        f"vLLM's cache is not full and its token share falls with the load. "
        f"docs/paper.md explains each difference from the paper."
    )


@paper_app.command("fig12")
def fig12(
    duration: Annotated[float, typer.Option("--duration", help="Seconds of Poisson arrivals per simulation.")] = 600.0,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the workloads.")] = 0,
    slo: Annotated[str, typer.Option("--slo", help="The latency target a sustained rate meets.")] =
        "mean_normalized_latency<0.1s",
    cost: Annotated[str, typer.Option("--cost", help="Cost profile (kvlab cost) or file: the clock \\[default: "
                                      "paper-2023, the paper-era clock].")] = "paper-2023",
    workers: WorkersOpt = None,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    as_json: JsonOpt = False,
    out: Annotated[Path | None, typer.Option("--out", help="Keep the store (sweep.duckdb, resumable) and write "
                                             "fig12.png, fig12_capacity.png, fig12.html, fig12.json here.")] = None,
) -> None:
    """Figure 12: normalized latency against rate, and the rate each system sustains (OPT-13B, one A100-40GB,
    ShareGPT and Alpaca stand-ins), with vLLM's ratios beside the paper's 1.7-2.7x and 2.7-8x."""
    from kvlab.paper import Fig12Setup, fig12_json, run_fig12
    from kvlab.sweep.capacity import parse_slo
    from kvlab.sweep.point import resolve_points
    from kvlab.sweep.session import Session, run_session

    parse_slo(slo)
    setup = Fig12Setup(duration=duration, seed=seed, slo=slo, cost=cost)
    resolve_points([setup.point(s, w, 1.0) for w in setup.workloads for s in ("vllm-paper", "orca-max")],
                   kvlab.__version__)  # (a bad --duration, --seed or --cost is refused before anything runs)
    session = Session(out, workers, ray, ray_address, as_json, writes=FIG12_FILES)
    session.check_ray()
    result = run_session(session, lambda: run_fig12(setup, session.runner))
    data = fig12_json(result)
    data["num_computed"] = session.runner.num_computed
    data["num_points"] = session.runner.num_total_before  # (each point once, as the progress line counts them)
    if out is not None:
        _write_fig12(result, data, out)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    _print_fig12(data)


def _write_fig12(result, data: dict, out: Path) -> None:
    from kvlab.sweep.grid import run_options
    from kvlab.sweep.html import write_html
    from kvlab.sweep.plots import capacity_panels, latency_panels, write_png

    curves = latency_panels(result.curve_rows + result.probe_rows, list(run_options()))
    bars = capacity_panels(result.configurations, result.searches)
    curves, bars = _flag_beyond_axis(curves, data), _flag_beyond_axis(bars, data)
    png, capacity_png, html, data_json = (out / name for name in FIG12_FILES)
    write_png(curves, png, title="Figure 12: normalized latency against request rate (OPT-13B, A100-40GB)", ymax=1.0)
    write_png(bars, capacity_png, title=f"Sustained rate under {result.setup.slo}")
    write_html(html, [("Normalized latency (s/token) against request rate", curves, 1.0),
                      (f"Sustained rate under {result.setup.slo}", bars, None)],
               title="vLLM paper, Figure 12, rebuilt by kvlab", data=data)
    data_json.write_text(json.dumps(data, indent=2))
    note_written(out, [png, capacity_png, html, data_json])


def _flag_beyond_axis(panels: list, data: dict) -> list:
    """Each panel of a workload: the paper's axis end as a dashed line (bars) or a grey mark (curves), each
    capacity marked on the curves, and a note for every capacity beyond the paper's axis."""
    from dataclasses import replace

    flagged = []
    for panel in panels:
        workload = next((w for w in data["workloads"] if w in panel.title), None)
        if workload is None:
            flagged.append(panel)
            continue
        entry = data["workloads"][workload]
        top = entry["paper_axis_rps"][1]
        notes = list(entry["beyond_paper_axis"].values())
        if panel.kind == "bar":
            flagged.append(replace(panel, threshold=top, threshold_label=f"paper's axis ends at {top:g} req/s",
                                   notes=notes))
        else:
            marks = {**entry["capacities"], "paper's axis end": top}
            flagged.append(replace(panel, marks=marks, notes=notes))
    return flagged


def _print_fig12(data: dict) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from kvlab.paper import PAPER_NAMES
    from kvlab.report.text import computed_text, plural

    setup = data["setup"]
    workloads = setup["workloads"]
    table = Table(title=f"vLLM paper, Figure 12: the rate each system sustains (req/s) with {setup['slo']}",
                  title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)  # (as every table)
    table.add_column("system")
    for workload in workloads:
        table.add_column(f"{workload}\n(paper's axis 0-{_axis(workload)})", justify="right")
    for system in PAPER_NAMES:
        table.add_row(PAPER_NAMES[system], *(_bracket(data["workloads"][w]["searches"][system]) +
                                             (" beyond axis" if system in data["workloads"][w]["beyond_paper_axis"]
                                              else "") for w in workloads))
    console = Console()
    console.print(table)
    for workload in workloads:
        for note in data["workloads"][workload]["beyond_paper_axis"].values():
            console.print(f"{workload}: {note}", highlight=False)
    for workload in workloads:
        ratios = data["workloads"][workload]["ratios"]
        parts = []
        for name, value in ratios.items():
            paper = data["paper_ratios"][name]
            where = ""
            if paper is not None and workload == "paper-sharegpt":
                verdict = "inside" if paper[0] <= (value or 0) <= paper[1] else "outside"
                where = f" (paper {paper[0]:g}-{paper[1]:g}x: {verdict})"
            parts.append(f"{name.replace('vllm_vs_', 'vs ').replace('_', '-')} "
                         f"{'–' if value is None else f'{value:.2f}x'}{where}")
        console.print(f"vLLM on {workload}: " + ", ".join(parts), highlight=False)
    console.print(f"Setup: OPT-13B on one A100-40GB, 12 GiB of KV cache (Table 1), {setup['duration_s']:g} s of "
                  f"Poisson arrivals per simulation, seed {setup['seed']}, cost profile "
                  f"{setup['cost']}; {plural(data['num_points'], 'point')} (the curves' rates and the searches' "
                  f"probes, each once, as the progress line counts them): "
                  f"{computed_text(data['num_computed'], data['num_points'], 'simulation')}. The paper's ranges are "
                  "for ShareGPT over three model sizes; docs/paper.md explains the differences.", highlight=False)


def _axis(workload: str) -> str:
    from kvlab.paper import FIG12_RATE_AXES

    return f"{FIG12_RATE_AXES[workload]:g}"


def _bracket(search: dict) -> str:
    if search["error"]:
        return f"failed: {search['error']}"
    lo, hi = search["bracket"]
    from kvlab.report.tables import bracket_text
    from kvlab.sweep.capacity import rate_text

    answer = search["capacity_text"] if search["capacity_rps"] is None else rate_text(search["capacity_rps"])
    return f"{answer} {bracket_text(lo or 0, hi)}"


@paper_app.command("fig18b")
def fig18b(
    block_sizes: Annotated[str, typer.Option("--block-sizes", help="Comma list of block sizes.")] =
        "1,2,4,8,16,32,64,128,256",
    duration: Annotated[float, typer.Option("--duration", help="Seconds of Poisson arrivals per simulation.")] = 600.0,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the workloads.")] = 0,
    workers: WorkersOpt = None,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    as_json: JsonOpt = False,
    out: Annotated[Path | None, typer.Option("--out", help="Keep the store (sweep.duckdb, resumable) and write "
                                             "fig18b.png and fig18b.json here.")] = None,
) -> None:
    """Figure 18b: vLLM's normalized latency against block size (OPT-13B, one A100-40GB, ShareGPT and Alpaca),
    beside §7.2's best block sizes."""
    from kvlab.paper import FIG18B_COST_NOTE, Fig18bSetup, run_fig18b
    from kvlab.sweep.session import Session, run_session

    try:
        sizes = tuple(int(b) for b in block_sizes.split(","))
    except ValueError:
        raise KvlabError(f"--block-sizes {block_sizes!r}: not a comma list of whole numbers; valid: e.g. "
                         "16,32,64") from None
    if not sizes or min(sizes) < 1:
        raise KvlabError(f"--block-sizes {block_sizes!r}: valid: whole numbers of at least 1")
    setup = Fig18bSetup(block_sizes=sizes, duration=duration, seed=seed)
    session = Session(out, workers, ray, ray_address, as_json, writes=FIG18B_FILES)
    session.check_ray()
    rows = run_session(session, lambda: run_fig18b(setup, session.runner))
    notes = [FIG18B_COST_NOTE] + _block_sizes_notes([b for b in sizes if cuda_block_size_note(b)])
    data = {"setup": {"model": setup.model, "gpu": setup.gpu, "available_kv_gib": setup.available_kv_gib,
                      "duration_s": setup.duration, "seed": setup.seed, "cost": setup.cost,
                      "block_sizes": list(sizes)}, "rows": rows, "notes": notes}
    if out is not None:
        png, data_json = (out / name for name in FIG18B_FILES)
        _plot_fig18b(rows, png)
        data_json.write_text(json.dumps(data, indent=2))
        note_written(out, [png, data_json])
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.console import Console

    console = Console(highlight=False)  # (wrapped at the terminal's width, 80 columns where none: trial 58, finding 8)
    for workload in setup.workloads:
        mine = [r for r in rows if r["workload"] == workload]
        typer.echo(f"{workload} at {mine[0]['rate']:g} req/s: normalized latency (s/token) by block size")
        for r in mine:
            value = r["normalized_latency_s_per_token"]
            typer.echo(f"  {r['block_size']:>4}  {'failed' if value is None else f'{value:.4f}'}")
        # (two lines, each wrapped: the default sizes' one line was 83 columns, trial 58, finding 8)
        console.print(f"  kvlab's best: {', '.join(map(str, mine[0]['kvlab_best']))}", markup=False)
        console.print(f"  paper's (§7.2): {', '.join(map(str, mine[0]['paper_best']))}: "
                      f"{'agrees' if mine[0]['agrees'] else 'differs'}", markup=False)
    for note in notes:
        console.print(f"note: {note}", markup=False)


def _block_sizes_notes(refused: list[int]) -> list[str]:
    """kvlab.sizing.cuda_block_size_note once for every block size vLLM's CUDA backends refuse (it was said once for
    each: four copies for the default 1, 2, 4, 8)."""
    if not refused:
        return []
    note = cuda_block_size_note(refused[0]) or ""
    if len(refused) == 1:
        return [note]
    return [note.replace(f"--block-size {refused[0]}:", f"--block-size {', '.join(map(str, refused))}:", 1)
            .replace("would refuse it", "would refuse them", 1)]


def _plot_fig18b(rows: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload and r["normalized_latency_s_per_token"] is not None]
        ax.plot([r["block_size"] for r in mine], [r["normalized_latency_s_per_token"] for r in mine], marker="o",
                label=f"{workload} (paper's best {mine[0]['paper_best'][0]}-{mine[0]['paper_best'][-1]})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.set_title("Figure 18b, rebuilt by kvlab (no per-block kernel cost)", fontsize=9)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
