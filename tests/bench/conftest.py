"""Fixtures of the bench tests: the real vLLM server (tests/vllm_server.py) and the fault-injecting one."""

from __future__ import annotations

import pytest
from fault_server import FaultServer, FaultState
from vllm_server import ServerSettings, VllmServer

_started: list[VllmServer] = []


@pytest.fixture(scope="module")
def vllm_server_factory(tmp_path_factory):
    """``start(ServerSettings(...)) -> VllmServer``: a real vLLM OpenAI API server on 127.0.0.1, stopped at the
    end of the module that started it (a server left running for the session took CPU from the tests that time
    the real engine later: tests/test_vllm_timing.py failed in CI at a load average of 6 on 2 CPUs); its log
    stays in the session's temporary folder."""

    def start(settings: ServerSettings | None = None, **kwargs) -> VllmServer:
        server = VllmServer.start(tmp_path_factory.mktemp("vllm-server"), settings or ServerSettings(), **kwargs)
        _started.append(server)
        return server

    yield start
    while _started:
        _started.pop().stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report ends with the tail of each running vLLM server's log."""
    report = yield
    if report.when == "call" and report.failed:
        for server in _started:
            report.sections.append((f"vLLM server log ({server.log_path})", server.log_tail(60)))
    return report


@pytest.fixture
def fault_server():
    with FaultServer(FaultState()) as server:
        yield server
