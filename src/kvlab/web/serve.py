"""Running the lab's app under uvicorn: bind first (so a busy port is a clear error), then serve."""

from __future__ import annotations

import errno
import socket
import threading
import webbrowser

from kvlab.errors import KvlabError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


HOST_VALID = "valid: an address of this machine, e.g. 127.0.0.1 (the default), or 0.0.0.0 for every interface"


def check_host(host: str) -> None:
    """Refuse a --host that cannot be one address: empty, with a port in it, or an IPv6 address in URL brackets."""
    if not host.strip():
        raise KvlabError(f"--host {host!r} is empty; {HOST_VALID}")
    if host.startswith("["):
        inner, _, rest = host[1:].partition("]")
        port = f" and give the port with --port {rest[1:]}" if rest.startswith(":") and rest[1:] else ""
        raise KvlabError(f"--host {host}: drop the brackets (--host {inner}){port}; {HOST_VALID}")
    name, colon, port = host.rpartition(":")
    if colon and host.count(":") == 1:
        raise KvlabError(f"--host {host} holds a port; give the port with --port (--host {name} --port {port}); "
                         f"{HOST_VALID}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; port 0 picks a free one."""
    check_host(host)
    if not 0 <= port <= 65535:
        raise KvlabError(f"--port {port} is out of range: 0 to 65535 (0 picks a free port)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        # A name that does not resolve, or an address that is not this machine's, is the host's fault, not the port's.
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            hint = ("--host is not an address of this machine; give one that is, e.g. 127.0.0.1 (the default) or "
                    "0.0.0.0 (every interface)")
        else:
            hint = "pick another with --port"
        raise KvlabError(f"cannot serve on {host}:{port} ({exc.strerror}); {hint}") from None
    sock.listen(64)
    sock.setblocking(False)
    return sock


def make_server(sock: socket.socket, host: str):
    import uvicorn

    from kvlab.web.server import create_app

    allowed = None if host in LOOPBACK else ["*"]
    config = uvicorn.Config(create_app(allowed_hosts=allowed), log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


def serve(sock: socket.socket, *, host: str = "127.0.0.1", open_browser: str | None = None) -> None:
    """Serve until interrupted; opens ``open_browser`` (a URL) once the server accepts connections."""
    server = make_server(sock, host)
    if open_browser:

        def opener() -> None:
            while not server.started and not server.should_exit:
                threading.Event().wait(0.05)
            if server.started:
                webbrowser.open(open_browser)

        threading.Thread(target=opener, daemon=True).start()
    threading.Thread(target=warm_rates, args=(server,), daemon=True).start()
    server.run(sockets=[sock])


def warm_rates(server) -> None:
    """Section 7's searches for the default setup, begun as `kvlab lab` starts (in their low-priority worker
    process): first the two systems the first screen waits for (RateLab.opening_systems), then the other two, so
    that the first figure's rate, and its sentence about that rate, are ready by the time a reader's figure
    stops."""
    from kvlab.errors import KvlabError
    from kvlab.web.params import parse_rate_setup

    rates, setup = server.config.app.state.rates, parse_rate_setup({})
    try:
        rates.breaking_points(setup, rates.opening_systems())
        rates.breaking_points(setup)
    except KvlabError:
        pass  # (the page asks again, and shows the reason in section 7's slot)
    except RuntimeError:
        if not server.should_exit:
            raise
        # (stopped in its first seconds: the workers were shut down under the warm-up, and nothing needs warming)


def serve_in_thread(host: str = "127.0.0.1", port: int = 0):
    """Start the lab in a background thread (tests, benchmarks). Returns (server, thread, base_url);
    stop it with ``server.should_exit = True; thread.join()``."""
    sock = bind(host, port)
    server = make_server(sock, host)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the lab server stopped while starting")
        threading.Event().wait(0.02)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"
