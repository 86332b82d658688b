"""``kvlab sweep``: many `kvlab run` points at once, stored in DuckDB, on local processes or a Ray cluster; the
session (checks, store, pool, progress, interrupts) that ``kvlab capacity`` (cli/capacity.py) shares.

Any `kvlab run` option takes a comma list (``--rate 1,2 --strategy vllm,orca-oracle``); ``--grid FILE`` holds
more (kvlab/sweep/grid.py). Everything is checked before anything runs.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kvlab.cli.app import app
from kvlab.cli.options import JsonOpt

if TYPE_CHECKING:
    from kvlab.sweep.runner import Runner
    from kvlab.sweep.store import Store

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
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Run even when the estimate exceeds --max-time.")]
MaxTimeOpt = Annotated[str, typer.Option("--max-time", help="Refuse (without --yes) a sweep estimated to take "
                                         "longer than this: 90s, 20m, 2h.")]
RetryOpt = Annotated[bool, typer.Option("--retry-failed", help="Compute again the points stored as failed.")]


def parse_duration(text: str) -> float:
    from kvlab.errors import KvlabError

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|h)?\s*", text)
    if not match:
        raise KvlabError(f"--max-time {text!r}: expected a duration such as 90s, 20m or 2h")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


MAX_WORKERS = 1024


def default_workers() -> int:
    """The cores this process may use (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def grid_lists(args: list[str], grid: Path | None) -> tuple[dict[str, list], list[dict]]:
    from kvlab.sweep.grid import parse_cli_args, read_grid_file

    lists, explicit = read_grid_file(grid) if grid is not None else ({}, [])
    lists.update(parse_cli_args(args))
    return lists, explicit


class Session:
    """What both commands share: the checks, the store, the pool, the progress, an interrupt that keeps what
    is stored."""

    store: Store  # these three from start() on
    pool: Any
    runner: Runner
    finished = False  # finish() ran without an interrupt: every point is stored (what is left: the answer)

    def __init__(self, out: Path | None, workers: int | None, ray: bool, ray_address: str | None, as_json: bool):
        from kvlab.errors import KvlabError
        from kvlab.validate import check_output_path

        check_output_path(out, "--out", folder=True)
        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise KvlabError(f"--workers {workers} is out of range; valid: worker processes (or Ray CPUs), a whole "
                             f"number from 1 to {MAX_WORKERS:,}")
        self.out, self.as_json = out, as_json
        self.workers = workers or default_workers()
        self.ray, self.ray_address = ray, ray_address
        stop_on_signals(self)

    @property
    def store_path(self) -> str:
        from kvlab.sweep.store import DB_NAME

        return "(in memory)" if self.out is None else str(self.out / DB_NAME)

    def check_ray(self) -> None:
        from kvlab.sweep.runner import check_reachable, import_ray, resolve_ray_address

        if not (self.ray or self.ray_address):
            return
        import_ray()
        if self.ray_address:
            check_reachable(resolve_ray_address(self.ray_address))

    def stored_keys(self) -> set[str]:
        """Keys already stored, without creating anything (nothing is written before the checks pass)."""
        from kvlab.sweep.grid import row_kinds
        from kvlab.sweep.store import DB_NAME, Store

        if self.out is None or not (self.out / DB_NAME).exists():
            return set()
        store = Store(self.out / DB_NAME, row_kinds())
        try:
            return store.stored_keys()
        finally:
            store.close()

    def check_time(self, points: list, num_runs: float, max_time: str, yes: bool, what: str) -> None:
        from kvlab.errors import KvlabError
        from kvlab.sweep.point import estimate_seconds

        limit = parse_duration(max_time)
        if not points:
            return
        seconds = estimate_seconds(points) * num_runs / len(points) / self.workers
        if seconds > limit and not yes:
            raise KvlabError(f"{what}: about {format_duration(seconds)} on {self.workers} workers, more than "
                             f"--max-time {max_time}; add --yes to run it anyway, or sweep fewer points")

    def start(self) -> None:
        import kvlab
        from kvlab.sweep import stop
        from kvlab.sweep.grid import row_kinds
        from kvlab.sweep.runner import Runner, make_pool
        from kvlab.sweep.store import DB_NAME, Store

        with stop.held():  # (a signal meanwhile stops the session once all three exist: ray.init must not break)
            path = None if self.out is None else self.out / DB_NAME  # no folder: a throwaway in-memory store
            self.store = Store(path, row_kinds())
            self.pool = make_pool(self.workers, ray=self.ray, ray_address=self.ray_address)
            self.runner = Runner(self.store, self.pool, kvlab.__version__, progress=self._progress_callback())

    def _progress_callback(self):
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal and not self.as_json:
            return RichProgress(console)
        return LineProgress()

    def finish(self, *, interrupted: bool = False) -> None:
        """Stop the progress, the pool (waiting for it, or ``interrupted``: killing its workers) and close the
        store; whatever of it ``start`` got to (a signal may come while it runs)."""
        from kvlab.sweep import stop

        with stop.held():
            runner, pool, store = (getattr(self, name, None) for name in ("runner", "pool", "store"))
            if runner is not None and isinstance(runner.progress, RichProgress):
                runner.progress.stop()
            if pool is not None:
                pool.close(cancel=interrupted)
            if store is not None:
                self.num_stored = store.num_stored()
                store.close()
            if not interrupted:
                self.finished = True
                stop.after_finish()  # (the plots: a signal now ends the command after them)


class RichProgress:
    """A bar with finished / running / failed and the time left."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("points"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=console)
        self.progress.start()
        self.task = self.progress.add_task("points", total=None, status="")

    def __call__(self, done: int, running: int, failed: int, total: int) -> None:
        self.progress.update(self.task, completed=done, total=total,
                             status=f"finished {done} · running {running} · failed {failed}")

    def stop(self) -> None:
        self.progress.stop()


class LineProgress:
    """A line on stderr per stored point, for logs (stderr is not a terminal)."""

    def __init__(self):
        self.last = None

    def __call__(self, done: int, running: int, failed: int, total: int) -> None:
        if (done, total) != self.last:
            print(f"points: {done}/{total} stored · running {running} · failed {failed}", file=sys.stderr, flush=True)
            self.last = (done, total)


def run_session(session: Session, work):
    """``work()`` inside the session. SIGINT or SIGTERM (kvlab.sweep.stop, from Session() on) stops the workers and
    keeps what is stored; the command then says in one line how to resume and exits 130 or 143 (stop_on_signals).
    Whatever else stops it, the workers are stopped and the store closed with every finished point in it."""
    try:
        session.start()
        result = work()
    except BaseException:
        session.finish(interrupted=True)
        raise
    session.finish()
    return result


def stop_on_signals(session: Session) -> None:
    """SIGINT and SIGTERM noted from now until the command ends, raised as kvlab.sweep.stop.Stopped where that is
    safe; as the command ends, one that came says how many points are stored and exits 128 + signum (the Exit
    replaces a Stopped on its way out). Outside a command (no Click context) nothing is installed."""
    from kvlab.sweep import stop

    try:
        from typer._click.globals import get_current_context  # (Typer's own copy of Click, in recent versions)
    except ImportError:
        from click import get_current_context
    context = get_current_context(silent=True)
    if context is None:
        return
    stop.install()

    def end() -> None:
        signum = stop.received()
        try:
            if signum is not None:
                num_stored = getattr(session, "num_stored", None)
                if num_stored is None:  # (stopped before the session started)
                    num_stored = len(session.stored_keys())
        finally:
            stop.restore()
        if signum is not None:
            runner = getattr(session, "runner", None)
            computed = 0 if runner is None else runner.num_computed
            counts = (f"{computed:,} point{'' if computed == 1 else 's'} computed now ({num_stored:,} in all stored in "
                      f"{session.store_path})")
            if session.finished:  # (the signal came as the answer was written: it was, whole)
                print(f"stopped by {stop.signal_name(signum)} once the work was done: {counts}", file=sys.stderr,
                      flush=True)
            else:
                print(f"stopped by {stop.signal_name(signum)}: {counts}; run the same command again to resume (stored "
                      "points are never recomputed)", file=sys.stderr, flush=True)
            raise typer.Exit(128 + signum)

    context.call_on_close(end)


def point_json(row: dict[str, Any], option_names: list[str]) -> dict[str, Any]:
    summary = json.loads(row["summary"]) if row["summary"] else {}
    summary.pop("name", None)
    return {**{n: row[n] for n in option_names}, "key": row["key"], "status": row["status"], "error": row["error"],
            **summary}


@app.command(context_settings=SWEEP_CONTEXT, epilog=EXTRA_HELP)
def sweep(
    ctx: typer.Context,
    grid: GridOpt = None,
    workers: WorkersOpt = None,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    out: OutOpt = DEFAULT_OUT,
    max_time: MaxTimeOpt = "1h",
    yes: YesOpt = False,
    retry_failed: RetryOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a grid of `kvlab run` points and store every summary in DuckDB; run again, it resumes.

    Any of `kvlab run`'s options takes a comma list; the grid is every combination."""
    import kvlab
    from kvlab.sweep.grid import expand, run_options
    from kvlab.sweep.point import resolve_points

    lists, explicit = grid_lists(ctx.args, grid)
    points = resolve_points(expand(lists, explicit), kvlab.__version__)
    session = Session(out, workers, ray, ray_address, as_json)
    session.check_ray()
    stored = set() if retry_failed else session.stored_keys()
    todo = [p for p in points if p.key not in stored]
    session.check_time(todo, len(todo), max_time, yes, f"{len(todo)} of {len(points)} points to compute")
    rows = run_session(session, lambda: session.runner.run(points))
    names = list(run_options())
    written = write_sweep_plots(rows, names, out)
    if as_json:
        from kvlab.sweep.grid import row_kinds

        typer.echo(json.dumps({"points": [point_json(r, list(row_kinds())) for r in rows], "num_computed":
                               session.runner.num_computed, "store": str(out / "sweep.duckdb")}, indent=2))
        return
    varied = {name for name, values in lists.items() if len(values) > 1} | {n for p in explicit for n in p}
    print_sweep(rows, names, session, written, varied)


def write_sweep_plots(rows, names, out: Path) -> list[Path]:
    from kvlab.sweep.html import write_html
    from kvlab.sweep.plots import latency_panels, write_png

    panels = latency_panels(rows, names)
    if not panels:
        return []
    title = "Normalized latency against request rate"
    return [write_png(panels, out / "latency.png", title=title),
            write_html(out / "sweep.html", [(title, panels, None)], title="kvlab sweep")]


def print_sweep(rows, names, session: Session, written: list[Path], varied: set[str] | None = None) -> None:
    from rich.console import Console

    from kvlab.sweep.slo import latency_cell

    varying = shown_columns(rows, names, varied)
    failed = any(row["status"] != "ok" for row in rows)  # (a status column only then: the table fits 80 columns)
    table_rows = []
    for row in rows:
        ok = row["status"] == "ok"
        cells = [f"{row['throughput_rps']:.3f}", f"{row['throughput_tps']:.0f}",
                 _num(row.get("normalized_latency_s_per_token_mean")), latency_cell(row.get("ttft_s_p99")),
                 latency_cell(row.get("tpot_s_p99"))] if ok else ["–"] * 5
        status = ["ok" if ok else f"failed: {row['error']}"] if failed else []
        table_rows.append([*(cell(row[n]) for n in varying), *cells, *status])
    headers = (*varying, "req/s", "tok/s", "s/tok", "TTFT p99", "TPOT p99", *(["status"] if failed else []))
    table = _whole_values_table(f"Sweep: {len(rows)} points", headers, table_rows, left={*varying, "status"},
                                wrapping={"status"})
    console = Console()
    console.print(table)
    console.print("s/tok: mean normalized latency (end-to-end seconds per output token); TTFT and TPOT: p99, in ms "
                  "below 10 s, in s above.", highlight=False)
    from kvlab.report.setup import engine_defaults_text
    from kvlab.strategies import parse_strategy

    strategies = [parse_strategy(n) for n in dict.fromkeys(str(r["strategy"]) for r in rows)]
    console.print("Engine: " + engine_defaults_text(rows, strategies) + ".", highlight=False)
    num_failed = sum(r["status"] != "ok" for r in rows)
    console.print(_computed_text(session.runner.num_computed, len(rows), "point")
                  + (f", {num_failed} failed in all" if num_failed else "")
                  + f". Store: {session.store_path} (table points: SQL or pandas)."
                  + (f" Plots: {', '.join(str(p) for p in written)}." if written else ""), highlight=False)


def shown_columns(rows, names, varied=None) -> list[str]:
    """The options whose values differ between the rows, among those the user varied (``varied``; a stored row
    also holds what follows from them, such as the blocks a utilization gives, which the store keeps)."""
    shown = [n for n in names if (varied is None or n in varied) and len({repr(r[n]) for r in rows}) > 1]
    return shown or ["strategy"]


def cell(value) -> str:
    """An option's value in a table: a resolved number in a few digits (6.645, not 6.644978334195912)."""
    from kvlab.report.tables import significant

    if isinstance(value, float) and not value.is_integer():
        return significant(value)
    return str(value)


def _whole_values_table(title: str, headers, rows: list[list[str]], *, left: set[str], wrapping: set[str]):
    """A table in which every value is whole (but in the ``wrapping`` columns) and each header is stacked at its
    underscores and spaces to about its values' width: at 80 columns, three varying options' names once left
    the numbers no room at all."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for i, column in enumerate(headers):
        widest = None if column in wrapping else max((len(cells[i]) for cells in rows), default=1)
        table.add_column(_stacked(column, widest or len(column)), min_width=widest,
                         justify="left" if column in left else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def _stacked(header: str, width: int) -> str:
    """``header`` on lines of about ``width`` characters (at least 4), broken after underscores and at spaces:
    'gpu_memory_utilization' over 3-character values is 'gpu_' / 'memory_' / 'utilization'."""
    import re

    lines: list[str] = []
    for part in re.findall(r"[^_ ]+[_ ]?", header):
        if lines and len(lines[-1] + part.rstrip()) <= max(width, 4):
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(line.rstrip() for line in lines)


def _computed_text(num_computed: int, num_total: int, noun: str) -> str:
    """'Computed 4 points now', '..., 3 were stored already', 'Computed 1 simulation now'."""
    from kvlab.cli.size import plural

    text = f"Computed {plural(num_computed, noun)} now"
    num_stored = max(0, num_total - num_computed)
    if num_stored:
        text += f", {num_stored:,} {'was' if num_stored == 1 else 'were'} stored already"
    return text


def _num(value, scale: float = 1.0) -> str:
    from kvlab.report.tables import significant

    return "–" if value is None else significant(value * scale)
