"""kvlab: shows, measures and predicts why vLLM is fast.

The core (catalog, sizing, workload, memory, sched, cost, sim, metrics) is a library with no I/O;
the faces (cli, report, web, vllm, bench) call it.
"""

__version__ = "0.1.0"
