"""Each class of requests' entry, from a run's records (the definitions: kvlab.service.classes, which gives classes
their SLOs and reports them; a sweep point stores these entries, kvlab.sweep.point)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvlab.metrics import RequestRecord, distribution
from kvlab.sweep.slo import Slo
from kvlab.window import LATENCY_METRICS


def class_summaries(records: list[RequestRecord], class_of: Mapping[int, int],
                    slos: Mapping[int, Slo]) -> dict[str, dict[str, Any]]:
    """Each class's entry (module doc), keyed by the class as text, in class order."""
    members: dict[int, list[RequestRecord]] = {number: [] for number in slos}
    for record in records:
        members.setdefault(class_of[record.request_id], []).append(record)
    return {str(number): _class_entry(members[number], slos.get(number)) for number in sorted(members)}


def _class_entry(records: list[RequestRecord], slo: Slo | None) -> dict[str, Any]:
    import numpy as np

    finished = [r for r in records if r.status == "finished"]
    rejected = sum(1 for r in records if r.status == "rejected")
    aborted = sum(1 for r in records if r.status == "aborted")
    latencies = np.array([[r.ttft for r in finished], [math.nan if r.tpot is None else r.tpot for r in finished],
                          [r.e2e_latency for r in finished], [r.normalized_latency for r in finished]],
                         dtype=np.float64).reshape(len(LATENCY_METRICS), len(finished))
    entry: dict[str, Any] = {
        "num_requests": len(records), "num_finished": len(finished), "num_rejected": rejected,
        "num_aborted": aborted,
        "rejected_share": rejected / len(records) if records else 0.0,
        "abandoned_share": aborted / len(records) if records else 0.0,
        "ttft_s": distribution(latencies[0].tolist()),
        "tpot_s": distribution([v for v in latencies[1].tolist() if not math.isnan(v)]),
        "e2e_latency_s": distribution(latencies[2].tolist()),
    }
    if slo is not None:
        values = {term.text: term.value(latencies) for term in slo.terms}
        met = np.logical_and.reduce([term.met_by_each(latencies) for term in slo.terms]
                                    ) if slo.terms else np.ones(len(finished), dtype=bool)
        if slo.abandoned_text is not None:
            values[slo.abandoned_text] = entry["abandoned_share"]
        entry.update(slo=slo.text, slo_values=values,
                     slo_held=bool(finished) and all(values[t.text] <= t.limit_s for t in slo.terms)
                     and entry["abandoned_share"] <= (slo.max_abandoned or 0.0),
                     goodput=float(met.sum()) / len(records) if records else 0.0)
    return entry
