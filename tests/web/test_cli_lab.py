"""`kvlab lab`: serves the page on loopback; a bad or busy port is one clear line."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import httpx
import pytest


def test_lab_serves_the_page_on_loopback():
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvlab", "lab", "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        url = match.group(0)
        for _ in range(100):
            try:
                page = httpx.get(url, timeout=5)
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        assert page.status_code == 200 and "kvlab lab" in page.text
        assert httpx.get(url + "static/lab.js").status_code == 200
        # Bound to loopback only: the port is not open on the machine's other addresses.
        port = int(match.group(1))
        others = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        for address in others - {"127.0.0.1"}:
            with socket.socket() as s:
                s.settimeout(1)
                assert s.connect_ex((address, port)) != 0, address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_busy_port_is_a_clear_error(kvlab):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = kvlab("lab", "--port", str(port), "--no-browser")
    assert r.exit_code == 2
    assert f"cannot serve on 127.0.0.1:{port}" in r.stderr and "pick another with --port" in r.stderr


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1"])  # (no such name; an address not this machine's)
def test_bad_host_hints_at_host_not_port(kvlab, host):
    r = kvlab("lab", "--host", host, "--port", "0", "--no-browser")
    assert r.exit_code == 2
    message = " ".join(r.stderr.split())
    assert f"cannot serve on {host}:0" in message and "--host is not an address of this machine" in message
    assert "--port" not in message


def test_port_out_of_range(kvlab):
    r = kvlab("lab", "--port", "70000", "--no-browser")
    assert r.exit_code == 2
    assert "--port 70000 is out of range: 0 to 65535" in r.stderr


def test_a_lab_stopped_in_its_first_seconds_stops_quietly():
    """Ctrl-C while section 7's warm-up still runs: one line, no traceback from the warm-up thread (whose worker
    processes were shut down under it; a user's trial saw `cannot schedule new futures after shutdown`)."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "kvlab", "lab", "--port", "0", "--no-browser"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "http://127.0.0.1:" in proc.stdout.readline()
        time.sleep(1.0)  # (the warm-up has begun: it starts with the server)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "Traceback" not in err and "stopped by SIGINT" in err, err


@pytest.mark.parametrize("host, words", [
    ("", ["--host '' is empty", "0.0.0.0 for every interface"]),
    ("localhost:8000", ["give the port with --port", "--host localhost --port 8000"]),
    ("[::1]", ["drop the brackets", "--host ::1"]),
])  # (trial 48, finding 7)
def test_a_host_that_is_not_one_address_is_refused_with_its_hint(kvlab, host, words):
    r = kvlab("lab", "--host", host, "--port", "0", "--no-browser")
    message = " ".join(r.stderr.split())
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(w in message for w in words) and "cannot serve" not in message, message
