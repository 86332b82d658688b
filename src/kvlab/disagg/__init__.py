"""Disaggregated prefill and decode (xPyD): prefill replicas compute the prompts, their KV crosses a link to decode
replicas that generate the answers, as vLLM's disaggregated prefilling does with a KV connector (NixlConnector,
P2pNcclConnector); docs/disaggregation.md.

    from kvlab.disagg.fleet import DisaggFleet
    result = DisaggFleet(strategy, config.engine, workload, router, config.disagg).run()   # a DisaggResult
    result.summary()          # kvlab run's summary of the whole fleet, and "disaggregation": the link, the
                              # transfers, TTFT's parts, each side's replicas
    result.as_result()        # the fleet as one engine's SimResult, on the clients' clock

The pieces: config.py (the shape and the link), sides.py (each side's engine and memory, the transfer in simulated
time), fleet.py (the two sides on one clock), result.py (what it did). Only config.py is imported here: the
configuration reads it, and the rest imports the engine.
"""

from kvlab.disagg.config import DisaggConfig, disagg_options, resolve_disagg

__all__ = ["DisaggConfig", "disagg_options", "resolve_disagg"]
