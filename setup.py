"""Compiles kvlab's engine with mypyc when asked (KVLAB_COMPILE=1; build_backend/kvlab_build.py), from the same typed
sources that the pure-Python engine runs: one set of rules, two ways to run them (issue 34). Anything missing or
failing falls back to the pure-Python engine with one line saying so, never a half-built package.
`kvlab --version` says which engine is installed."""

from __future__ import annotations

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The hot modules (cProfile on `python benchmarks/bench_sim.py --quick`). Not sched/policy.py: its FCFSQueue
# subclasses collections.deque, which a mypyc native class cannot (it crashed in deque.__init__).
ENGINE = [
    "kvlab.sim", "kvlab.metrics", "kvlab.cost.model", "kvlab.fleet.fleet",
    "kvlab.sched.batching", "kvlab.sched.output", "kvlab.sched.preemption", "kvlab.sched.runs",
    "kvlab.sched.scheduler", "kvlab.sched.seq",
    "kvlab.memory", "kvlab.memory.base", "kvlab.memory.block_needs", "kvlab.memory.block_pool",
    "kvlab.memory.buddy", "kvlab.memory.contiguous", "kvlab.memory.paged",
]  # (kvlab.COMPILED_MODULES says the same: tests/test_engine.py)


def source(module: str) -> str:
    path = "src/" + module.replace(".", "/")
    return path + ("/__init__.py" if os.path.isdir(path) else ".py")


PURE_COST = "the pure-Python engine, about 2x the CPU time of the compiled one on long runs (benchmarks/README.md)"


def say(line: str) -> None:
    print(f"kvlab: {line}", file=sys.stderr, flush=True)


class FallBackBuildExt(build_ext):
    """A C compile that fails removes whatever it built and leaves the pure-Python engine."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # (distutils' CompileError and LinkError, a missing header, ...)
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            say(f"the compile failed ({type(error).__name__}: {error}); installing {PURE_COST}")
            return
        say("engine: compiled (mypyc)")


def ext_modules() -> list:
    if os.environ.get("KVLAB_EDITABLE") or os.environ.get("KVLAB_BUILD_REQUIRES"):
        return []  # an editable install runs the sources; the requirements phase builds nothing (kvlab_build.py)
    if os.environ.get("KVLAB_COMPILE", "") in ("", "0"):
        say(f"installing {PURE_COST}; KVLAB_COMPILE=1 compiles it with mypyc (a C compiler, 1-3 minutes)")
        return []
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler.split()[0]) is None:
        say(f"no C compiler ({compiler}); installing {PURE_COST}")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        say(f"mypyc is not installed; installing {PURE_COST}")
        return []
    try:
        return mypycify([source(module) for module in ENGINE], opt_level="3")
    except BaseException as error:  # (mypy's type errors end in SystemExit)
        say(f"mypyc refused the engine ({type(error).__name__}: {error}); installing {PURE_COST}")
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": FallBackBuildExt})
