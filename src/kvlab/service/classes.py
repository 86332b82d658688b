"""Classes of requests, each with its own latency target (SLO) and goodput, reported per class
(docs/admission.md).

A request's class is its priority (kvlab.workload.priority: a file's ``priority`` column, or ``--priority-classes``
drawn with the workload's seed), the one per-request label a workload carries. ``--slo-classes`` gives a class an
SLO in --slo's own spelling (kvlab.sweep.slo), classes separated by semicolons:

    --slo-classes "0:p99_ttft<1s;1:p99_e2e<60s,p50_tpot<50ms"

Per class c, over its requests R_c (offered: rejected and aborted ones included):

    num_requests       |R_c|;  num_finished, num_rejected, num_aborted: by how each ended
    rejected_share     num_rejected / |R_c|
    ttft_s, tpot_s,    each latency's mean, p50, p90, p99 over the finished requests of R_c (kvlab.metrics'
    e2e_latency_s      definitions)
    abandoned_share    num_aborted / |R_c| (clients that gave up at their deadline, --timeout)
    slo_values         each term's statistic over the finished requests of R_c; slo_held: every term within its limit
                       and the abandoned share within the SLO's ``abandoned<X%`` (0 without the term: kvlab.sweep.slo)
    goodput            |{r in R_c finished, every term's latency of r within the term's limit}| / |R_c|
                       (DistServe's goodput as a share; a rejected or aborted request never counts)

The statistic judges the requests served; the goodput charges the class for the ones it turned away.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvlab.errors import KvlabError
from kvlab.sweep.classes import class_summaries
from kvlab.sweep.slo import Slo, parse_slo

VALID = ('valid: CLASS:SLO pairs separated by ";", CLASS a priority of the workload, SLO as --slo writes it, '
         'e.g. "0:p99_ttft<1s;1:p99_e2e<60s"')


def parse_slo_classes(text: str | None) -> dict[int, Slo]:
    """``CLASS:SLO;...`` -> {class: Slo}; {} for None."""
    from kvlab.workload.priority import parse_priority

    if text is None:
        return {}
    slos: dict[int, Slo] = {}
    for part in text.split(";"):
        name, sep, slo_text = part.strip().partition(":")
        if not sep or not slo_text.strip():
            raise KvlabError(f"--slo-classes {text!r}: {part.strip()!r} names no class and SLO; {VALID}")
        number = parse_priority(name.strip(), f"--slo-classes {text!r}")
        if number in slos:
            raise KvlabError(f"--slo-classes {text!r}: class {number} appears twice; {VALID}")
        try:
            slos[number] = parse_slo(slo_text.strip())
        except KvlabError as error:
            raise KvlabError(f"--slo-classes {text!r}, class {number}: {error}") from None
    return slos


def check_classes(slos: Mapping[int, Slo], known: set[int], declared: set[int] | frozenset[int] = frozenset()
                  ) -> None:
    """A class given an SLO must be one of the workload's (``known``: the priorities its requests carry), as a
    per-class --timeout must; one --priority-classes declares (``declared``) that no request drew is said so."""
    classes = ", ".join(map(str, sorted(known)))
    for number in slos:
        if number in known:
            continue
        if number in declared:  # (trial 51: it was judged 'missed: none of its requests finished', goodput 0.0%)
            raise KvlabError(f"--slo-classes names class {number}, which no request of this workload has: "
                             f"--priority-classes declares it, but the requests drawn fall in {classes}; valid: "
                             "those classes, or more requests (-n) to draw it")
        raise KvlabError(f"--slo-classes names class {number}, which the workload does not have; valid: its "
                         f"classes, {classes} (--priority-classes, or a file's priority column)")


def check_deadlines(slos: Iterable[Slo], points: Iterable[Mapping[str, Any]]) -> None:
    """An SLO bounding the abandoned share (``abandoned<5%``, kvlab.sweep.slo) judges clients that give up at their
    deadline: refused where no request has one (no --timeout, no timeout column in the workload file), since it
    would hold whatever the engine did. ``points``: each configuration's options, as a grid's point or
    ``KvlabConfig.workload`` gives them (``workload``, ``timeout``); for --slo in kvlab capacity and --slo-classes
    in kvlab run and race."""
    from kvlab.config.options import OPTIONS
    from kvlab.workload.load import has_own_deadlines

    bounds = [slo.abandoned_text for slo in slos if slo.abandoned_text is not None]
    if not bounds:
        return
    for point in points:
        if not point.get("timeout") and not has_own_deadlines(str(point.get("workload") or OPTIONS["workload"].default)):
            raise KvlabError(f"{bounds[0]}: no request in this workload has a deadline; valid: with --timeout SECONDS "
                             "or a workload file's timeout column")


def declared_classes(config) -> set[int]:
    """The classes --priority-classes declares (none without it)."""
    from kvlab.workload.priority import parse_classes

    text = config.workload.priority_classes
    return {number for number, _ in parse_classes(text)} if text else set()


def known_classes(config, workload=None) -> set[int]:
    """The classes of a configuration's workload: the priorities its requests carry (``workload``, or the
    configuration's, loaded); a class --priority-classes declares that no request drew is not one of them."""
    if workload is None:
        from kvlab.service.engine import load

        workload = load(config)
    return {r.priority for r in workload.requests}


def run_classes(run, slos: Mapping[int, Slo]) -> list[dict[str, dict[str, Any]]] | None:
    """Each result's classes (``class_summaries``), for a run (kvlab.service.RunResult) whose workload has more than
    one class or whose classes were given SLOs; None otherwise."""
    class_of = {r.request_id: r.priority for r in run.workload.requests}
    if not slos and len(set(class_of.values())) < 2:
        return None
    return [class_summaries(result.records, class_of, slos) for result in run.results]
