"""fix61: trial 60's leftover findings: --max-time without a unit, --workers beyond the cores, `kvlab size`'s
proposals for a model too large, calibrate's estimate and argument order, progress off a terminal, capacity's
rounds, fig12's table."""

from __future__ import annotations

import pytest

BARE = "error: --max-time '5' has no unit; valid: a number with s, m or h, such as 90s, 20m or 2h"


@pytest.mark.parametrize("command", [("sweep", "--rate", "1,2"), ("capacity",),
                                     ("capacity", "--replicas", "auto", "--rate", "2")])
def test_a_max_time_without_its_unit_is_refused_naming_the_valid_spellings(kvlab, tmp_path, command):
    # (a bare 5 was taken as 5 seconds though the error text and the help name 90s, 20m or 2h; capacity's fleet
    # search took any --max-time unread)
    out = tmp_path / "s"
    r = kvlab(*command, "--max-time", "5", "-n", "20", "--workers", "1", "--out", out)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == BARE
    assert not out.exists()


def test_a_max_time_with_its_unit_still_counts(kvlab, tmp_path):
    r = kvlab("sweep", "--rate", "1,2", "-n", "2000", "--workers", "1", "--max-time", "0.5s", "--out", tmp_path / "s")
    assert r.exit_code == 2 and "more than --max-time 0.5s; add --yes" in r.stderr


def test_workers_beyond_the_cores_are_capped_at_them_saying_so(kvlab, tmp_path, monkeypatch):
    from kvlab.sweep import session

    monkeypatch.setattr(session, "default_workers", lambda: 2)
    r = kvlab("sweep", "--rate", "1", "-n", "20", "--workers", "1000", "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0, r.stderr
    assert ("note: --workers 1000 is more than the 2 cores this machine gives kvlab; using 2; more run on a Ray "
            "cluster (--ray-address)") in r.stderr
    r = kvlab("sweep", "--rate", "1", "-n", "20", "--workers", "2", "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0 and "note: --workers" not in r.stderr


def test_a_session_and_calibrate_use_at_most_the_cores(monkeypatch, capsys):
    # (sweep, capacity and paper share the Session; calibrate --runs asks capped_workers itself)
    from kvlab.sweep import session

    monkeypatch.setattr(session, "default_workers", lambda: 3)
    assert session.capped_workers(64) == 3
    assert "note: --workers 64 is more than the 3 cores this machine gives kvlab; using 3" in capsys.readouterr().err
    assert session.capped_workers(3) == 3 and capsys.readouterr().err == ""
    assert session.Session(None, 1000, False, None, True).workers == 3
    assert session.Session(None, 1000, False, "10.0.0.1:6379", True).workers == 1000  # (a cluster's CPUs)
