"""kvlab's build backend: setuptools', asking for mypy (mypyc) only when the engine is to be compiled.

    pip install .                     # the pure-Python engine (the README's first command stays fast)
    KVLAB_COMPILE=1 pip install .     # the engine's hot modules compiled with mypyc from the same source (setup.py)
    pip install -e .                  # always pure Python: the sources are what runs (and what the mutation check edits)

The compile takes one to three minutes on a 2-core machine, so it is asked for, not the default (issue 34).
"""

from __future__ import annotations

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the PEP 517 hooks not overridden below)

# The version the engine was compiled and measured with (benchmarks/README.md); requirements/test.lock pins the same.
MYPY = "mypy==2.4.1"


def _compile_asked() -> bool:
    return os.environ.get("KVLAB_COMPILE", "") not in ("", "0")


def get_requires_for_build_wheel(config_settings=None):
    extra = [MYPY] if _compile_asked() else []
    # (setuptools runs setup.py here to read its requirements, before mypy is installed: it compiles nothing yet)
    os.environ["KVLAB_BUILD_REQUIRES"] = "1"
    try:
        return _setuptools.get_requires_for_build_wheel(config_settings) + extra
    finally:
        del os.environ["KVLAB_BUILD_REQUIRES"]


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.environ["KVLAB_BUILD_REQUIRES"] = "1"  # (setup.py again, for the metadata alone: nothing compiled, nothing said)
    try:
        return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    finally:
        del os.environ["KVLAB_BUILD_REQUIRES"]


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # An editable install runs the sources themselves: a compiled module beside its .py would shadow it.
    os.environ["KVLAB_EDITABLE"] = "1"
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
