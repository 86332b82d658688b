"""A sweep's session: the checks, the store, the pool, the progress and an interrupt that keeps what is stored,
shared by `kvlab sweep`, `kvlab capacity` (its rate search and its fewest-replicas search) and `kvlab paper`.

    Session(out, workers, ray, ...)   checked before anything runs; SIGINT / SIGTERM noted from here on
    run_session(session, work)        work() with the store (kvlab.sweep.store), the pool and the runner started;
                                      a signal stops the workers, keeps every stored point and ends the command
                                      with one line saying how to resume (kvlab.sweep.stop)
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.sweep.runner import Runner
    from kvlab.sweep.store import Store


def parse_duration(text: str) -> float:
    from kvlab.errors import KvlabError

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|h)?\s*", text)
    if not match:
        raise KvlabError(f"--max-time {text!r}: expected a duration such as 90s, 20m or 2h")
    if match.group(2) is None:  # (a bare 5 read as seconds where the help names units: trial 60, finding 9d)
        raise KvlabError(f"--max-time {text!r} has no unit; valid: a number with s, m or h, such as 90s, 20m or 2h")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def format_duration(seconds: float, above: float | None = None) -> str:
    """``seconds`` in words; rounded up when it is ``above`` a limit, so that it never reads as within it."""
    if seconds < 90:
        return f"{math.ceil(seconds) if above is not None and seconds > above else round(seconds):.0f} s"
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


def capped_workers(workers: int, beyond: str = "") -> int:
    """``workers`` local processes, at most the cores this process may use: more only queue for the same cores (trial
    60, finding 9e: --workers 1000 on 2 cores was taken), so beyond them one line on stderr says so and the cores are
    used. A Ray cluster's CPUs (--ray-address) are not this machine's: its callers do not ask."""
    cores = default_workers()
    if workers <= cores:
        return workers
    print(f"note: --workers {workers} is more than the {cores} core{'s' if cores > 1 else ''} this machine gives "
          f"kvlab; using {cores}{beyond}", file=sys.stderr, flush=True)
    return cores


def grid_lists(args: list[str], grid: Path | None) -> tuple[dict[str, list], list[dict]]:
    from kvlab.sweep.grid import parse_cli_args, read_grid_file

    lists, explicit = read_grid_file(grid) if grid is not None else ({}, [])
    lists.update(parse_cli_args(args))
    return lists, explicit


# The most distinct KV cache notes a sweep or a capacity search prints before its points run.
MAX_CACHE_NOTES = 3


class Session:
    """What both commands share: the checks, the store, the pool, the progress, an interrupt that keeps what
    is stored."""

    store: Store  # these three from start() on
    pool: Any
    runner: Runner
    finished = False  # finish() ran without an interrupt: every point is stored (what is left: the answer)

    def __init__(self, out: Path | None, workers: int | None, ray: bool, ray_address: str | None, as_json: bool,
                 writes: tuple[str, ...] = ()):
        """``writes``: the files the command writes into ``out`` beside the store (glob patterns), none of which may
        be a file kvlab did not write there (kvlab.validate.check_output_path)."""
        from kvlab.errors import KvlabError
        from kvlab.validate import check_output_path

        check_output_path(out, "--out", folder=True, writes=writes)
        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise KvlabError(f"--workers {workers} is out of range; valid: worker processes (or Ray CPUs), a whole "
                             f"number from 1 to {MAX_WORKERS:,}")
        self.out, self.as_json = out, as_json
        self.workers = default_workers() if workers is None else workers if ray_address else capped_workers(
            workers, "; more run on a Ray cluster (--ray-address)")
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
            workers = f"{self.workers} worker{'s' if self.workers > 1 else ''}"
            raise KvlabError(f"{what}: about {format_duration(seconds, above=limit)} of simulation on {workers}, "
                             f"more than --max-time {max_time}; add --yes to run it anyway, or sweep fewer points")

    def say_cache_notes(self, points: list) -> None:
        """On stderr, before the points run, the notes `kvlab run` prints of their KV caches (kvlab.sweep.point.
        cache_notes: a hybrid model's KV cache groups, per group or pooled), each distinct one once, at most
        MAX_CACHE_NOTES (a grid of many pools has one for each)."""
        from rich.console import Console

        from kvlab.sweep.point import cache_notes

        console = Console(stderr=True)
        notes = cache_notes(points)
        for note in notes[:MAX_CACHE_NOTES]:
            console.print(f"note: {note}", style="yellow", highlight=False)
        if len(notes) > MAX_CACHE_NOTES:
            console.print(f"note: {len(notes) - MAX_CACHE_NOTES} more notes like these, one for each other KV cache "
                          "of the points (`kvlab run` with a point's options prints its own)", style="yellow",
                          highlight=False)

    def start(self) -> None:
        import kvlab
        from kvlab.sweep import stop
        from kvlab.sweep.grid import row_kinds
        from kvlab.sweep.runner import Runner, make_pool
        from kvlab.sweep.store import DB_NAME, Store

        with stop.held():  # (a signal meanwhile stops the session once all three exist: ray.init must not break)
            # The pool first: a local Ray instance starts with SIGINT and SIGTERM blocked in this, the only thread
            # (runner.RayPool), so that a signal waits for kvlab's handler; the store's DuckDB threads come after.
            self.pool = make_pool(self.workers, ray=self.ray, ray_address=self.ray_address)
            path = None if self.out is None else self.out / DB_NAME  # no folder: a throwaway in-memory store
            self.store = Store(path, row_kinds())  # (a failure here: the session's end closes the pool)
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
            if runner is not None and isinstance(runner.progress, (RichProgress, LineProgress)):
                runner.progress.stop()  # (a log's last line, where it was held back)
            if pool is not None:
                pool.close(cancel=interrupted)
            if store is not None:
                self.num_stored = store.num_stored()
                store.close()
            if not interrupted:
                self.finished = True
                stop.after_finish()  # (the plots: a signal now ends the command after them)


# What a search's total is: the points asked for so far (it grows only when the search asks for more).
SO_FAR = "the total: points asked for so far (a search asks for more until it settles)"


class RichProgress:
    """A bar with finished / running / failed and the time left."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("points"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=console)
        self.progress.start()
        self.task = self.progress.add_task("points", total=None, status="")

    def __call__(self, done: int, running: int, failed: int, total: int, final: bool = True) -> None:
        self.progress.update(self.task, completed=done, total=total,
                             status=f"finished {done} · running {running} · failed {failed}" + ("" if final else
                                                                                                f" · {SO_FAR}"))

    def stop(self) -> None:
        self.progress.stop()


class LineProgress:
    """For logs (stderr is not a terminal): a line on stderr when a tenth more of the points is stored, EVERY_S
    seconds have passed or every point asked for is stored, and at the end the last if it was held back (stop); not
    one per point (trial 60, finding 9a: about 100 lines for `kvlab paper fig12`)."""

    EVERY_S = 5.0
    SHARE = 0.1

    def __init__(self):
        self.last: tuple[int, int] | None = None
        self.said_at, self.said_done = -math.inf, 0
        self.pending: str | None = None  # (the newest line not printed)

    def __call__(self, done: int, running: int, failed: int, total: int, final: bool = True) -> None:
        import time

        if (done, total) == self.last:
            return
        self.last = (done, total)
        counts = f"{done}/{total} stored" if final else f"{done} stored of {total} asked for so far"
        self.pending = f"points: {counts} · running {running} · failed {failed}"
        now = time.monotonic()
        if done >= total or now - self.said_at >= self.EVERY_S or done - self.said_done >= self.SHARE * total:
            self._say()
            self.said_at, self.said_done = now, done

    def stop(self) -> None:
        self._say()

    def _say(self) -> None:
        if self.pending is not None:
            print(self.pending, file=sys.stderr, flush=True)
            self.pending = None


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
    import typer

    from kvlab.sweep import stop

    try:
        from typer._click.globals import get_current_context  # (Typer's own copy of Click, in recent versions)
    except ImportError:
        from click import get_current_context  # type: ignore[no-redef]
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
            points = f"{computed:,} point{'' if computed == 1 else 's'} computed now"
            kept = session.out is not None
            counts = f"{points} ({num_stored:,} in all stored in {session.store_path})" if kept else \
                f"{points}, in memory only (no --out), so none is kept"
            if session.finished:  # (the signal came as the answer was written: it was, whole)
                print(f"stopped by {stop.signal_name(signum)} once the work was done: {counts}", file=sys.stderr,
                      flush=True)
            elif kept:
                print(f"stopped by {stop.signal_name(signum)}: {counts}; run the same command again to resume (stored "
                      "points are never recomputed)", file=sys.stderr, flush=True)
            else:
                print(f"stopped by {stop.signal_name(signum)}: {counts}; with --out DIR a stopped run resumes where it "
                      "stopped", file=sys.stderr, flush=True)
            raise typer.Exit(128 + signum)

    context.call_on_close(end)
