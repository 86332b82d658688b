"""Fix 58b (trial 58, finding 2): bench's refusal of a workload beyond kvlab's limits says "pass --yes to go
ahead", and bench takes --yes with the meaning it has elsewhere."""

from __future__ import annotations


def _workload(tmp_path, n: int):  # (12 output tokens: a well-behaved answer, fault_server.py)
    path = tmp_path / "workload.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "".join(f"{i * 0.01:.2f},10,12\n" for i in range(n)))
    return path


def test_bench_takes_the_yes_its_refusal_names(kvlab, fault_server, tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_MAX_MEMORY_BYTES", "1000")  # (the limit lowered: 8 requests are beyond it)
    workload = _workload(tmp_path, 8)
    refused = kvlab("bench", "--url", fault_server.url, "-w", workload, "--arrival", "trace")
    assert refused.exit_code == 2 and "pass --yes to go ahead" in refused.stderr, refused.stderr
    assert fault_server.state.received == []  # (refused before any load)
    done = kvlab("bench", "--url", fault_server.url, "-w", workload, "--arrival", "trace", "--yes")
    assert done.exit_code == 0, done.stderr
    assert len(fault_server.state.received) == 8
