"""``kvlab lab``: the lab in the browser, served from this machine."""

from __future__ import annotations

import typer

from kvlab.cli.app import app


@app.command()
def lab(
    port: int = typer.Option(8765, "--port", help="Port to serve on; 0 picks a free one."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind. Loopback by default: the lab is for this machine."
    ),
    no_browser: bool = typer.Option(False, "--no-browser", help="Do not open a browser."),
) -> None:
    """Watch a KV cache fill, fragment and page, block by block, then race four strategies: a local web page."""
    from kvlab.web.serve import bind, serve

    sock = bind(host, port)
    shown = "127.0.0.1" if host in ("127.0.0.1", "0.0.0.0") else f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/"
    if host not in ("127.0.0.1", "localhost", "::1"):
        typer.secho(
            f"warning: serving on {host}: anyone who can reach this machine can run simulations on it",
            fg="yellow",
            err=True,
        )
    typer.echo(f"kvlab lab: {url}  (Ctrl-C stops it)")
    serve(sock, host=host, open_browser=None if no_browser else url)
