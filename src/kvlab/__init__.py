"""kvlab: shows, measures and predicts why vLLM is fast.

The core (catalog, sizing, workload, memory, sched, cost, sim, metrics) is a library with no I/O;
the faces (cli, report, web, vllm, bench) call it.
"""

__version__ = "0.1.0"

# The modules setup.py compiles with mypyc when asked (KVLAB_COMPILE=1 pip install .): the engine's hot path.
COMPILED_MODULES = (
    "kvlab.sim", "kvlab.metrics", "kvlab.cost.model", "kvlab.fleet.fleet",
    "kvlab.sched.batching", "kvlab.sched.output", "kvlab.sched.preemption", "kvlab.sched.runs",
    "kvlab.sched.scheduler", "kvlab.sched.seq",
    "kvlab.memory", "kvlab.memory.base", "kvlab.memory.block_needs", "kvlab.memory.block_pool",
    "kvlab.memory.buddy", "kvlab.memory.contiguous", "kvlab.memory.paged",
)


def engine() -> str:
    """Which engine is loaded: "compiled (mypyc)" when every module of COMPILED_MODULES is a compiled extension,
    "pure Python" when none is (an editable install, or no compiler at install time). A mix is a broken install."""
    import importlib

    compiled = [not (importlib.import_module(name).__file__ or "").endswith(".py") for name in COMPILED_MODULES]
    if all(compiled):
        return "compiled (mypyc)"
    if not any(compiled):
        return "pure Python"
    raise RuntimeError(f"kvlab's engine is half compiled ({sum(compiled)} of {len(compiled)} modules): reinstall kvlab")
