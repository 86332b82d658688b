"""Classes of a workload's clients: their priority, for vLLM's ``--scheduling-policy priority`` (smaller is served
first), and how long they wait before giving up.

A user's file may give each request its own priority (a ``priority`` column, kvlab.workload.files); a generated
workload draws one per request from ``--priority-classes``, written ``PRIORITY:SHARE,...`` (``0:0.2,1:0.8``: a
fifth of the requests at priority 0, the rest at 1; the shares sum to 1), with the workload's seed (a file with
its own ``priority`` column and ``--priority-classes`` together are refused, as for deadlines below).
``--timeout`` gives every client a deadline, ``SECONDS`` after its request arrives, or one per priority class,
``PRIORITY:SECONDS,...`` (a class not named waits as long as it takes; a class no request has is refused): the
simulator aborts a request whose deadline passes before it finishes (kvlab.sim, Request.timeout). A user's file may
give each request its own deadline instead (a ``timeout`` column); a file with one and ``--timeout`` together are
refused: which deadline a request has would depend on a precedence rule the user has to remember.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kvlab.errors import KvlabError
from kvlab.workload.request import Request

_VALID = ("valid: PRIORITY:SHARE pairs separated by commas, e.g. 0:0.2,1:0.8 (integer priorities, smaller served "
          "first; shares > 0 summing to 1)")


def parse_priority(value, where: str) -> int:
    """One request's priority: an integer (vLLM's ``priority``, any sign), read exactly (a float would turn
    99999999999999999999999 into 99999999999999991611392)."""
    from kvlab.validate import cell_number

    try:
        number = cell_number(value, whole=True)  # (exact: an int where the text has no point)
    except ValueError:
        number = math.nan
    if isinstance(number, int):
        return number
    if not (math.isfinite(number) and number.is_integer()):
        shown = "true" if value is True else "false" if value is False else repr(value)  # (JSON's spelling)
        raise KvlabError(f"{where}: priority {shown} is not an integer; valid: a whole number, smaller served "
                         "first (vLLM's --scheduling-policy priority)")
    return int(number)


def parse_classes(text: str) -> tuple[tuple[int, float], ...]:
    """``PRIORITY:SHARE,...`` as (priority, share) pairs, the shares summing to 1."""
    pairs: list[tuple[int, float]] = []
    for part in text.split(","):
        priority, sep, share = part.strip().partition(":")
        if not sep:
            raise KvlabError(f"--priority-classes {text!r}: {part.strip()!r} has no share; {_VALID}")
        number = parse_priority(priority.strip(), f"--priority-classes {text!r}")
        try:
            weight = float(share)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise KvlabError(f"--priority-classes {text!r}: share {share.strip()!r} of priority {number} is not a "
                             f"number > 0; {_VALID}")
        if any(number == p for p, _ in pairs):
            raise KvlabError(f"--priority-classes {text!r}: priority {number} appears twice; {_VALID}")
        pairs.append((number, weight))
    total = sum(w for _, w in pairs)
    if abs(total - 1) > 1e-6:  # (0:0.2,1:0.7 is a typo more often than weights meant to be scaled)
        raise KvlabError(f"--priority-classes {text!r}: the shares sum to {total:g}, not 1; {_VALID}")
    return tuple((p, w / total) for p, w in pairs)


def with_clients(requests: tuple[Request, ...], priority: tuple[int, ...] | None, priority_classes: str | None,
                 timeout: str | None, seed: int, deadlines: tuple[float, ...] | None = None) -> tuple[Request, ...]:
    """The requests with their clients' classes: a file's ``priority`` column, or ``priority_classes`` drawn on a
    third stream of the workload's seed (the lengths and arrivals stay those the seed draws without classes); then
    the deadlines of ``timeout``, or a file's own (``deadlines``: its ``timeout`` column, one per request)."""
    if deadlines is not None and timeout:
        raise KvlabError(f"--timeout {timeout}: the workload file gives each request its own deadline (its timeout "
                         "column); valid: one of the two, drop --timeout or the file's timeout column")
    if priority is not None and priority_classes:
        raise KvlabError(f"--priority-classes {priority_classes}: the workload file gives each request its own "
                         "priority (its priority column); valid: one of the two, drop --priority-classes or the "
                         "file's priority column")
    if priority is None and not priority_classes and not timeout and deadlines is None:
        return requests
    if priority_classes:
        rng = np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(3)[2])
        requests = assign_classes(requests, priority_classes, rng)
    elif priority is not None:
        requests = tuple(replace(r, priority=p) for r, p in zip(requests, priority))
    if deadlines is not None:
        return tuple(replace(r, timeout=t) for r, t in zip(requests, deadlines))
    return assign_timeouts(requests, timeout) if timeout else requests


def clients_note(priority_classes: str | None, timeout: str | None, own_deadlines: bool = False) -> str:
    """What a workload's description adds about its clients' classes and deadlines ('' when it has neither)."""
    note = f" Priority classes {priority_classes} (priority:share, smaller served first)." if priority_classes else ""
    if own_deadlines:
        return note + " Each client gives up after its request's own timeout (the file's timeout column)."
    return note + (f" Clients give up after {timeout} s (--timeout)." if timeout else "")


def parse_deadline(value, where: str) -> float:
    """A client's deadline: seconds after its request's arrival, a finite number > 0 (``where`` names the cell)."""
    from kvlab.validate import cell_number

    try:
        number = float(cell_number(value))
    except (ValueError, OverflowError):
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise KvlabError(f"{where}: timeout {value!r} is not a number of seconds > 0; valid: seconds after the "
                         "request's arrival that its client waits for the whole answer (e.g. 30), on every row or "
                         "on none")
    return number


def parse_timeouts(text: str) -> dict[int, float] | float:
    """``SECONDS`` (every request) or ``PRIORITY:SECONDS,...`` (per class): seconds > 0."""
    valid = ("valid: seconds > 0 after a request's arrival (e.g. 30), or PRIORITY:SECONDS pairs separated by commas "
             "(e.g. 0:10,1:60)")

    def seconds(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise KvlabError(f"--timeout {text!r}: {value.strip()!r} is not a number of seconds > 0; {valid}")
        return number

    if ":" not in text:
        return seconds(text)
    timeouts: dict[int, float] = {}
    for part in text.split(","):
        priority, sep, value = part.strip().partition(":")
        if not sep:
            raise KvlabError(f"--timeout {text!r}: {part.strip()!r} names no priority class; {valid}")
        number = parse_priority(priority.strip(), f"--timeout {text!r}")
        if number in timeouts:
            raise KvlabError(f"--timeout {text!r}: priority {number} appears twice; {valid}")
        timeouts[number] = seconds(value)
    return timeouts


def assign_timeouts(requests: tuple[Request, ...], text: str) -> tuple[Request, ...]:
    """Each request's client deadline from ``--timeout`` (by its priority class, when given per class)."""
    timeouts = parse_timeouts(text)
    if isinstance(timeouts, float):
        return tuple(replace(r, timeout=timeouts) for r in requests)
    classes = sorted({r.priority for r in requests})
    if unknown := [p for p in timeouts if p not in classes]:
        raise KvlabError(f"--timeout {text!r}: no request has priority {unknown[0]}; valid: the workload's classes "
                         f"{', '.join(map(str, classes))} (--priority-classes or a file's priority column)")
    return tuple(replace(r, timeout=timeouts.get(r.priority)) for r in requests)


def assign_classes(requests: tuple[Request, ...], text: str, rng: np.random.Generator) -> tuple[Request, ...]:
    """Each request drawn into one of the classes of ``text``, by their shares."""
    classes = parse_classes(text)
    priorities = np.array([p for p, _ in classes])
    drawn = rng.choice(priorities, size=len(requests), p=[s for _, s in classes]).tolist()
    return tuple(replace(r, priority=p) for r, p in zip(requests, drawn))
