"""What a fleet did (``FleetResult``) and its numbers: each replica's summary and the fleet's, by kvlab.metrics'
own definitions, and the router's.

Over replicas j = 1..N, each replica's clock starting at the fleet's first arrival:

    fleet entry          kvlab.metrics.summarize over every replica's records, counters summed, memory integrals
                         summed (shares of all replicas' slot-seconds), makespan = the last finish anywhere
    served tokens_j      Σ (prompt_len + num_output_tokens) over the requests replica j finished
    load imbalance       max_j served_j / mean_j served_j         (1: even; N: one replica served everything)
    prefix hit rate      Σ num_cached_tokens / Σ prompt_len over admitted requests (vLLM's prefix-cache hits over
                         queries: each request's hit at its first admission)
    decisions            requests routed to each replica, and counted by the router's reason

With one replica the fleet entry is exactly the engine's own summary (`kvlab run`'s), and so are its records.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kvlab.config import SimConfig
from kvlab.fleet.admission import Gate
from kvlab.fleet.routers import RouterSpec
from kvlab.metrics import Counters, RequestRecord, UsageIntegral
from kvlab.sim import SimResult
from kvlab.spec.scheduler import merged_summary
from kvlab.strategies import Strategy


@dataclass
class FleetResult:
    """What a fleet did: each replica's own result (records, counters, memory integral, log), in replica order, and
    what the router decided. ``summary()`` is the fleet's `--json` entry (below)."""

    strategy: Strategy
    config: SimConfig
    workload_name: str
    router: RouterSpec
    replicas: list[SimResult]
    num_routed: list[int]  # requests the router gave each replica
    reasons: dict[str, int]  # decisions counted by the router's reason
    num_cached_tokens: list[int]  # per replica: prompt tokens found in its prefix cache at first admission
    num_queried_tokens: list[int]  # per replica: prompt tokens of the requests it admitted
    gate: Gate | None = None  # what the gateway in front of the router decided (kvlab.fleet.admission), if any

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    @property
    def records(self) -> list[RequestRecord]:
        """Every replica's records, and the gateway's of those that never reached one, in arrival order (as one
        engine's are)."""
        merged = [record for result in self.replicas for record in result.records]
        if self.gate is not None:
            merged += self.gate.refused
        return sorted(merged, key=lambda r: (r.arrival_time, r.request_id))

    def summary(self) -> dict:
        return fleet_summary(self)

    def as_result(self) -> SimResult:
        """The fleet as one engine's result, as a report reads one: every replica's records, counters and memory
        summed (and the gateway's, kvlab.fleet.admission), the last finish anywhere; the iteration log of a lone
        replica (several keep their own). Its ``summary()`` is this result's summary()["fleet"]."""
        replicas = self.replicas
        counters = summed_counters(r.counters for r in replicas)
        if self.gate is not None:
            with_gate(counters, self.gate)
        return SimResult(strategy=self.strategy, config=self.config, workload_name=self.workload_name,
                         records=self.records, counters=counters,
                         integral=summed_integral(r.integral for r in replicas),
                         log=replicas[0].log if len(replicas) == 1 else None,
                         makespan=max((r.makespan for r in replicas), default=0.0))


def with_gate(counters: Counters, gate: Gate) -> None:
    """The engines' counters with the gateway's: its rejections (by reason) and the clients that left its queue."""
    for record in gate.refused:
        if record.status == "rejected":
            counters.num_rejected += 1
            reason = record.reject_reason or ""
            counters.reject_reasons[reason] = counters.reject_reasons.get(reason, 0) + 1
        else:
            counters.num_aborted += 1
            counters.num_with_deadline += 1
    counters.admission = gate.summary()


def summed_integral(integrals) -> UsageIntegral:
    total = UsageIntegral()
    for integral in integrals:
        for f in fields(UsageIntegral):
            setattr(total, f.name, getattr(total, f.name) + getattr(integral, f.name))
    return total


MAPPINGS = ("reject_reasons", "spec_decoding", "kv_offload", "admission")  # (Counters' fields that are not numbers)


def summed_counters(all_counters) -> Counters:
    """The replicas' counters as one engine's: numbers summed, rejections by reason, the CPU tiers' counts summed,
    speculative decoding's counts summed and its rates recomputed (kvlab.spec.scheduler.merged_summary)."""
    all_counters = list(all_counters)
    total = Counters()
    for counters in all_counters:
        for f in fields(Counters):
            if f.name not in MAPPINGS:
                setattr(total, f.name, getattr(total, f.name) + getattr(counters, f.name))
        for reason, count in counters.reject_reasons.items():
            total.reject_reasons[reason] = total.reject_reasons.get(reason, 0) + count
        for key, value in counters.kv_offload.items():
            total.kv_offload[key] = total.kv_offload.get(key, 0) + value
    total.spec_decoding = merged_summary([c.spec_decoding for c in all_counters])
    return total


def served_tokens(records) -> int:
    return sum(r.prompt_len + r.num_output_tokens for r in records if r.status == "finished")


def load_imbalance(served: list[int]) -> float | None:
    """max over mean of the replicas' served tokens; None when nothing was served."""
    mean = sum(served) / len(served) if served else 0.0
    return max(served) / mean if mean > 0 else None


def _rate(hits: int, queried: int) -> float | None:
    return hits / queried if queried else None


def fleet_summary(result: FleetResult) -> dict:
    replicas = result.replicas
    served = [served_tokens(r.records) for r in replicas]
    fleet = result.as_result().summary()
    per_replica = []
    for j, r in enumerate(replicas):
        entry = r.summary()
        entry.update(replica=j, num_routed=result.num_routed[j], served_tokens=served[j],
                     prefix_hit_rate=_rate(result.num_cached_tokens[j], result.num_queried_tokens[j]))
        per_replica.append(entry)
    return {
        "router": result.router.text,
        "num_replicas": result.num_replicas,
        "fleet": fleet,
        "prefix_hit_rate": _rate(sum(result.num_cached_tokens), sum(result.num_queried_tokens)),
        "load_imbalance": load_imbalance(served),
        "decisions": {"per_replica": list(result.num_routed), "reasons": dict(result.reasons)},
        "replicas": per_replica,
    }
