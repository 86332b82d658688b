"""What a disaggregated fleet did (``DisaggResult``) and its numbers.

Each request's record, as its client sees it, is put together from both sides:

    arrival, first_scheduled_time   the prefill replica's (when the client sent it; its prompt's first iteration)
    first_token_time, finish_time   the decode replica's: TTFT = prefill (queue + prompt) + transfer + the decode
                                    side's queue and its first iteration
    status                          the prefill side's when it did not finish there (rejected), else the decode's
    num_preemptions                 on both sides

The fleet entry is kvlab.metrics.summarize over those records, with every replica's memory integral summed (shares
of all replicas' slot-seconds) and their counters summed, except the tokens and requests finished, which are the
decode side's (a prefill replica's one token is the proxy's, not the client's). ``disaggregation`` adds:

    transfer_s        end - start of each transfer (DisaggConfig.transfer_seconds of its blocks), mean and max
    transfer_bytes    Σ blocks sent × block bytes
    kv_received_tokens, decode_prefix_hit_tokens
                      prompt tokens the decode side took from the link, and found in its own prefix cache (kvlab
                      sends the whole prompt all the same; vLLM reads only the blocks after the local hit)
    ttft_parts_s      means over finished requests: prefill = prefill's token - arrival; transfer; decode = the
                      decode side's first token - the transfer's end; outside_engine = the client's TTFT - those
                      three, i.e. the cost profile's request latency (request_latency_s: before the engine saw the
                      request) and admission lag (admission_lag_iterations and its spread: on the first token), 0
                      under a profile without them (roofline). The four sum to the summary's mean TTFT.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.config import SimConfig
from kvlab.config.router import RouterSpec
from kvlab.disagg.config import DisaggConfig
from kvlab.disagg.sides import Transfer
from kvlab.fleet.result import summed_counters, summed_integral
from kvlab.metrics import RequestRecord
from kvlab.sim import SimResult
from kvlab.strategies import Strategy


@dataclass
class DisaggResult:
    """Each side's replicas' own results (on the engine's clock), the transfers, where the routers sent each
    request, and the whole fleet as its clients saw it (``client``)."""

    strategy: Strategy
    config: SimConfig
    workload_name: str
    router: RouterSpec
    disagg: DisaggConfig
    prefill: list[SimResult]
    decode: list[SimResult]
    transfers: list[Transfer]  # in the order they ended
    prefill_replica_of: list[int]  # per request, in arrival order
    decode_replica_of: list[int]  # per transfer, in the order they ended
    # per decode replica: (prompt tokens whose KV came over the link, prompt tokens its own prefix cache held)
    num_received_tokens: list[tuple[int, int]]
    client: SimResult

    @property
    def records(self) -> list[RequestRecord]:
        return self.client.records

    def as_result(self) -> SimResult:
        return self.client

    def summary(self) -> dict:
        return {**self.client.summary(), "disaggregation": self.disaggregation()}

    def disaggregation(self) -> dict:
        """The summary's ``disaggregation`` entry (module doc)."""
        return disagg_summary(self)


def client_result(strategy: Strategy, config: SimConfig, workload_name: str, prefill: list[SimResult],
                  decode: list[SimResult]) -> SimResult:
    """The fleet as one engine's result, on the engine's clock (module doc)."""
    at_decode = {r.request_id: r for result in decode for r in result.records}
    records = []
    for result in prefill:
        for p in result.records:
            d = at_decode.get(p.request_id) if p.status == "finished" else None
            records.append(p if d is None else d._replace(arrival_time=p.arrival_time,
                                                          first_scheduled_time=p.first_scheduled_time,
                                                          num_preemptions=p.num_preemptions + d.num_preemptions))
    records.sort(key=lambda r: (r.arrival_time, r.request_id))
    counters = summed_counters(r.counters for r in [*prefill, *decode])
    decoded = summed_counters(r.counters for r in decode)
    counters.num_finished, counters.num_output_tokens = decoded.num_finished, decoded.num_output_tokens
    replicas = [*prefill, *decode]
    return SimResult(strategy=strategy, config=config, workload_name=workload_name, records=records,
                     counters=counters, integral=summed_integral(r.integral for r in replicas), log=None,
                     makespan=max((r.makespan for r in replicas), default=0.0))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def disagg_summary(result: DisaggResult) -> dict:
    disagg, transfers = result.disagg, result.transfers
    durations = [t.end - t.start for t in transfers]
    first_token = {r.request_id: r.first_token_time for p in result.prefill for r in p.records}
    arrival = {r.request_id: r.arrival_time for p in result.prefill for r in p.records}
    decoded = {r.request_id: r.first_token_time for d in result.decode for r in d.records
               if r.first_token_time is not None}
    sent = [t for t in transfers if t.request_id in decoded]
    client = {r.request_id: r for r in result.client.records if r.first_token_time is not None}
    engine_ttft = {t.request_id: decoded[t.request_id] - arrival[t.request_id] for t in sent}
    return {
        "shape": disagg.name,
        "num_prefill_replicas": disagg.num_prefill_replicas,
        "num_decode_replicas": disagg.num_decode_replicas,
        "link": disagg.link,
        "link_bandwidth_gb_s": disagg.link_bandwidth_bytes_per_s / 1e9,
        "link_latency_s": disagg.link_latency_s,
        "num_transfers": len(transfers),
        "transfer_bytes": sum(t.num_bytes for t in transfers),
        "transfer_s": {"mean": _mean(durations), "max": max(durations, default=None)},
        "ttft_parts_s": {
            "prefill": _mean([first_token[t.request_id] - arrival[t.request_id] for t in sent]),  # type: ignore[operator]
            "transfer": _mean([t.end - t.start for t in sent]),
            "decode": _mean([decoded[t.request_id] - t.end for t in sent]),
            "outside_engine": _mean([client[t.request_id].ttft - engine_ttft[t.request_id]  # type: ignore[operator]
                                     for t in sent]),
        },
        "kv_received_tokens": sum(received for received, _ in result.num_received_tokens),
        "decode_prefix_hit_tokens": sum(local for _, local in result.num_received_tokens),
        "prefill_replicas": [_side_entry(r, j, result.prefill_replica_of) for j, r in enumerate(result.prefill)],
        "decode_replicas": [_side_entry(r, j, result.decode_replica_of) for j, r in enumerate(result.decode)],
    }


def _side_entry(result: SimResult, j: int, replica_of: list[int]) -> dict:
    s = result.summary()
    return {"replica": j, "num_routed": replica_of.count(j), "mean_batch_size": s["mean_batch_size"],
            "preemptions": s["preemptions"], "memory_shares": s["memory_shares"]}

