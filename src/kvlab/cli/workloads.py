"""``kvlab workloads``: the named workloads, where each published trace is found; ``kvlab workloads fetch NAME``."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from kvlab.cli.app import app
from kvlab.cli.options import JsonOpt, WideOpt
from kvlab.errors import KvlabError
from kvlab.report.text import compact_table

workloads_app = typer.Typer(
    name="workloads",
    help="The named workloads: kvlab's own stand-ins and generators, and the published traces it reads (each "
         "fetched from its publisher with `kvlab workloads fetch NAME`).",
    invoke_without_command=True,
)
app.add_typer(workloads_app, name="workloads")

_COPY = {"built in": "built in", "KVLAB_TRACES_DIR": "env dir", "cache": "cache", "absent": "absent",
         "unreadable": "unreadable"}


@workloads_app.callback()
def workloads(ctx: typer.Context, as_json: JsonOpt = False, wide: WideOpt = False) -> None:
    """The named workloads: kvlab's own stand-ins and generators (built in) and the published traces, each with
    where its copy is (KVLAB_TRACES_DIR, the cache) or how to fetch it."""
    if ctx.invoked_subcommand is not None:
        return
    from dataclasses import asdict

    from rich.console import Console

    from kvlab.workload import list_workloads

    infos = list_workloads()
    if as_json:
        typer.echo(json.dumps([dict(asdict(i), present=i.present) for i in infos], indent=2))
        return
    kinds = {"trace with arrivals": "trace", "lengths only": "lengths", "stand-in": "stand-in",
             "generated sessions": "sessions"}
    table = compact_table("Workloads (use with --workload NAME)")
    columns = ["name", "kind", "copy", "rows", "mean\nprompt", "mean\noutput", "req/s", "licence"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("name", "kind", "copy", "licence") else "right", no_wrap=True)
    for i in infos:
        table.add_row(i.name, kinds.get(i.kind, i.kind), _COPY[i.copy], "–" if i.num_rows is None else f"{i.num_rows:,}",
                      "–" if i.mean_prompt_len is None else f"{i.mean_prompt_len:,.0f}",
                      "–" if i.mean_output_len is None else f"{i.mean_output_len:,.0f}",
                      "–" if i.mean_rate is None else f"{i.mean_rate:.2f}", i.licence)
    console = Console(highlight=False)
    console.print(table)
    console.print("kind: trace (its own arrival times), lengths (arrivals at --rate), stand-in (kvlab's fit to the "
                  "vLLM paper's means). copy: built in (kvlab's own), env dir (KVLAB_TRACES_DIR), cache (fetched), "
                  "absent (`kvlab workloads fetch NAME`, or set KVLAB_TRACES_DIR), unreadable (see below).")
    for i in infos:
        if i.copy == "unreadable":
            console.print(f"{i.name} is unreadable: {i.location}", soft_wrap=True)
    console.print("Sources" + (", with each published file's address, checksum and the names a copy may have:" if wide
                               else " (--wide: each published file's address and checksum):"))
    for i in infos:
        console.print(f"  {i.name}: {i.source}")
        if wide and i.url is not None:
            # Addresses and paths whole, however wide (soft wrap): a terminal's copy of a broken line is a broken address.
            console.print(f"    {i.url}", soft_wrap=True)
            console.print(f"    checksum {i.checksum}; file {' or '.join(i.filenames or ())}", soft_wrap=True)
        if wide and i.copy in ("KVLAB_TRACES_DIR", "cache"):
            console.print(f"    copy: {i.location}", soft_wrap=True)


@workloads_app.command()
def fetch(
    name: Annotated[str, typer.Argument(help="A published trace: azure-conv, azure-code, mooncake-conversation, "
                                             "mooncake-synthetic, burstgpt, llmservingsim-sharegpt, sharegpt-8k, "
                                             "arxiv, bwb.")],
    url: Annotated[Optional[str], typer.Option("--from", help="Download from this address instead (a mirror); the "
                                               "checksum is still the published one.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Fetch again even if the cache holds a good copy.")] = False,
) -> None:
    """Download a published trace from its publisher into kvlab's cache, check its checksum, and print its licence
    and citation."""
    from rich.console import Console

    from kvlab.workload import WORKLOADS
    from kvlab.workload.fetch import fetch as download
    from kvlab.workload.fetch import fetched, matches_checksum, source_address
    from kvlab.workload.published import TRACES, TRACES_DIR_VARIABLE, cache_dir, locate

    if name in WORKLOADS and name not in TRACES:
        raise KvlabError(f"{name} is one of kvlab's own workloads, built in: there is nothing to fetch; published "
                         f"traces: {', '.join(TRACES)}")
    if name not in TRACES:
        import difflib

        close = difflib.get_close_matches(name, [*TRACES], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KvlabError(f"unknown trace {name!r}{hint}; valid: {', '.join(TRACES)}")
    trace = TRACES[name]
    source = source_address(name, url)
    located = None if force or url is not None else locate(name)
    if located is not None and located.where == TRACES_DIR_VARIABLE:
        verified = "the published checksum" if matches_checksum(located.path, trace.checksum) else \
            f"a checksum other than the published {trace.checksum}"
        typer.echo(f"{name}: {TRACES_DIR_VARIABLE} already holds a copy, {located.path} ({verified}); kvlab reads "
                   "it from there: nothing to fetch (--force or --from downloads the published file into the cache)")
        return
    path = None if force else fetched(name)
    if path is None:
        err = Console(stderr=True, highlight=False)
        err.print(f"fetching {name} from {source}", soft_wrap=True)
        err.print(f"  into {cache_dir()}", soft_wrap=True)
        with _progress(err) as report:
            path = download(name, url=url, progress=report)
    else:
        typer.echo(f"{name}: already in the cache with the published checksum (--force fetches it again)")
    typer.echo(f"{name}: saved {path} ({path.stat().st_size:,} bytes, checksum {trace.checksum} verified)")
    typer.echo(f"licence: {trace.licence}; published by {trace.publisher}")
    typer.echo(f"cite: {trace.citation}")


def _progress(console):
    """A byte counter on stderr while a download runs (nothing when stderr is not a terminal)."""
    from contextlib import contextmanager

    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    @contextmanager
    def bar():
        with Progress("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as progress:
            task = progress.add_task("download", total=None)

            def report(done: int, total: int | None) -> None:
                progress.update(task, completed=done, total=total)

            yield report

    return bar()
