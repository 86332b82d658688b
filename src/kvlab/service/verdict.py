"""Who won a race, and what is a tie: one rule for `kvlab race` (report/tables.py) and the lab's finish line
(web/session.py), so the two name the same winner.

A race is won on request throughput. Two throughputs that read the same at three significant digits (as the race
table prints them: 2.3412 and 2.3449 both read 2.34) are a tie: a difference nobody can read decides nothing.

With client deadlines (--timeout), a strategy whose clients gave up finishes fewer requests sooner, and its
requests/s can top one that finished them all. So when some strategies lost requests to deadlines and others
lost none, only those that lost none contend; when every strategy lost some, the most finished requests/s wins
(an aborted request counts for nothing in it).
"""

from __future__ import annotations

from collections.abc import Sequence


def same_throughput(a: float, b: float) -> bool:
    """Equal as the race table shows them (3 significant digits)."""
    return f"{a:.3g}" == f"{b:.3g}"


def contenders(summaries: Sequence[dict]) -> list[dict]:
    """Who may win (module doc): those that lost no request to a client's deadline, when some did and some did not;
    otherwise every one."""
    whole = [s for s in summaries if not s.get("num_aborted")]
    return whole if whole else list(summaries)


def tied(summaries: Sequence[dict]) -> list[str]:
    """The contenders whose request throughput reads the same as the highest (more than one: a tie), in race
    order."""
    among = contenders(summaries)
    best = max(s["throughput_rps"] for s in among)
    return [s["name"] for s in among if same_throughput(s["throughput_rps"], best)]


def winner(summaries: Sequence[dict]) -> str | None:
    """Who served the most requests/s of the contenders; None when the best ties with another, or when fewer than
    two raced."""
    if len(summaries) < 2:
        return None
    names = tied(summaries)
    return names[0] if len(names) == 1 else None
