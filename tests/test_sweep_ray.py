"""The same sweep on a Ray cluster stores exactly what local workers store: on a cluster the test starts on
loopback with two CPUs (``--ray-address``), and on the local Ray instance ``--ray`` starts itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.test_sweep_run import SWEEP, stored

ray = pytest.importorskip("ray", reason="Ray is kvlab's optional extra `ray` (in the test extra)")


@pytest.fixture(scope="module")
def cluster():
    """A Ray head on 127.0.0.1 with two CPUs, owned by this test process, stopped afterwards."""
    context = ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    try:
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()


def _sweep(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "kvlab", "sweep", *SWEEP, *args, "--json"], check=False,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_ray_cluster_stores_what_local_workers_store(cluster, tmp_path):
    local = _sweep("--workers", "2", "--out", str(tmp_path / "local"))
    on_ray = _sweep("--ray-address", cluster, "--out", str(tmp_path / "ray"))
    assert local["num_computed"] == on_ray["num_computed"] == 8
    assert stored(tmp_path / "ray") == stored(tmp_path / "local")
    import duckdb

    with duckdb.connect(str(tmp_path / "ray" / "sweep.duckdb"), read_only=True) as db:
        workers = {w for (w,) in db.execute("SELECT worker FROM points").fetchall()}
    assert len(workers) >= 1 and all(":" in w for w in workers)  # host:pid of the Ray workers
    again = _sweep("--ray-address", cluster, "--out", str(tmp_path / "ray"))
    assert again["num_computed"] == 0


def test_ray_without_an_address_starts_and_stops_its_own(tmp_path):
    data = _sweep("--ray", "--workers", "2", "--out", str(tmp_path / "own"))
    assert data["num_computed"] == 8 and all(p["status"] == "ok" for p in data["points"])


def test_figure_18b_on_a_ray_cluster_gives_the_local_rows(cluster, tmp_path):
    def fig18b(*args: str) -> list[dict]:
        r = subprocess.run([sys.executable, "-m", "kvlab", "paper", "fig18b", "--block-sizes", "8,16", "--duration",
                            "30", "--json", *args], capture_output=True, text=True, check=False, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["rows"]

    assert fig18b("--ray-address", cluster) == fig18b("--workers", "1")
