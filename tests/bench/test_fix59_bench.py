"""Fix 59 (trial 58, finding 2's rest): bench's refusal of a workload beyond kvlab's memory limit quotes the memory,
not a simulator's time, which says nothing of how long a real server takes."""

from __future__ import annotations


def test_bench_refusal_quotes_memory_not_a_simulator_time(kvlab, fault_server, tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_MAX_MEMORY_BYTES", "1000")  # (the limit lowered: 8 requests are beyond it)
    workload = tmp_path / "workload.csv"
    workload.write_text("arrival_time,prompt_len,output_len\n" + "".join(f"{i * 0.01:.2f},10,12\n" for i in range(8)))
    refused = kvlab("bench", "--url", fault_server.url, "-w", workload, "--arrival", "trace")
    message = " ".join(refused.stderr.split())
    assert refused.exit_code == 2 and "of memory to hold them, beyond the limit of" in message, message
    assert "request-runs" not in message and " s and " not in message
    assert fault_server.state.received == []
