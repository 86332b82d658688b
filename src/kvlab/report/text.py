"""Words and tables the commands share: counts in words, tables whose values are never cut, a cost constant with
its unit. (Rich is imported where a table is drawn: `kvlab size` starts without it.)"""

from __future__ import annotations

import re


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 request', '2 requests'; ``many``: the plural where it is not the word + s ('1 strategy', '2 strategies')."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def dollars(amount: float) -> str:
    """'$1,234.56', and under a dollar three significant digits ('$0.0343', not '$0.03': trial 60, finding 9c)."""
    if abs(amount) >= 1 or amount == 0:
        return f"${amount:,.2f}"
    return f"${amount:.3g}"


def computed_text(num_computed: int, num_total: int, noun: str) -> str:
    """'Computed 4 points now', '..., 3 were stored already', 'Computed 1 simulation now'."""
    text = f"Computed {plural(num_computed, noun)} now"
    num_stored = max(0, num_total - num_computed)
    if num_stored:
        text += f", {num_stored:,} {'was' if num_stored == 1 else 'were'} stored already"
    return text


def whole_values_table(title: str, headers, rows: list[list[str]], *, left: set[str], wrapping: set[str]):
    """A table in which every value is whole (but in the ``wrapping`` columns) and each header is stacked at its
    underscores and spaces to about its values' width: at 80 columns, three varying options' names once left
    the numbers no room at all."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for i, column in enumerate(headers):
        widest = None if column in wrapping else max((len(cells[i]) for cells in rows), default=1)
        table.add_column(stacked(column, widest or len(column)), min_width=widest,
                         justify="left" if column in left else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def stacked(header: str, width: int) -> str:
    """``header`` on lines of about ``width`` characters (at least 4), broken after underscores and at spaces:
    'gpu_memory_utilization' over 3-character values is 'gpu_' / 'memory_' / 'utilization'."""
    lines: list[str] = []
    for part in re.findall(r"[^_ ]+[_ ]?", header):
        if lines and len(lines[-1] + part.rstrip()) <= max(width, 4):
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(line.rstrip() for line in lines)


def compact_table(title: str):
    """A table that fits 80 columns: no borders, one space between columns, values never cut."""
    from rich.table import Table

    return Table(title=title, title_justify="left", box=None, pad_edge=False, padding=(0, 1, 0, 0),
                 header_style="bold underline")


def constant_text(name: str, value: float) -> str:
    """A cost profile's constant with its unit: seconds (a name ending in _s) in ms, µs or ns; one below a
    thousandth of a nanosecond is nothing a GPU could time, said as '≈ 0 ns' with its seconds beside (trial 58,
    finding 13: '4.717e-11 µs'); the rest as is."""
    if name.endswith("_s"):
        size = abs(value)
        if size >= 1e-4 or value == 0:
            return f"{value * 1e3:.4g} ms"
        if size >= 1e-7:
            return f"{value * 1e6:.4g} µs"
        return f"{value * 1e9:.4g} ns" if size >= 1e-12 else f"≈ 0 ns ({value:.2g} s)"
    return f"{value:g}"


def constants_table(title: str):
    """The table of a fit's constants (constant, value, ± (1σ), what it is): names, values and spreads whole, on one
    line each; only the meaning wraps, so that it fits 80 columns with no name cut (trial 58, finding 13)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for header in ("constant", "value", "± (1σ)", "what it is"):  # (names whole: --fit takes them)
        table.add_column(header, justify="left" if header in ("constant", "what it is") else "right",
                         no_wrap=header != "what it is")
    return table


def same_decimals(values: list[float | None], digits: int = 3, most: int = 3) -> list[str]:
    """A table column's numbers, every one with the same number of decimals: as many as give its smallest non-zero
    value ``digits`` significant digits, at most ``most`` (trial 61, finding 10d: a fleet's TPOT column read "9.22"
    above "9.2"); None or NaN as "–"."""
    import math

    seen = [abs(v) for v in values if v is not None and v == v and v != 0]
    decimals = min(most, max(0, digits - 1 - math.floor(math.log10(min(seen))))) if seen else 0
    return ["–" if v is None or v != v else f"{v:,.{decimals}f}" for v in values]


def sentence(text: str) -> str:
    """``text`` ended with one full stop: none added after a stop or after the ellipsis of a shortened clause (trial
    61, finding 10c: "3 ms per iteration ….")."""
    return text if text.endswith((".", "…")) else text + "."


def latency_column(values: list[float | None]) -> tuple[str, list[str]]:
    """A column of latencies in one unit, for a table: ms when every value is below 10 s, s when any is 10 s or
    more (never a seven-digit count of milliseconds); the unit goes in the header, so the cells stay narrow; each
    cell to three significant digits, trailing zeros kept ("6.60" under "8.39")."""
    from kvlab.report.tables import significant

    seen = [v for v in values if v is not None and v == v]
    unit, scale = ("s", 1.0) if any(v >= 10 for v in seen) else ("ms", 1e3)
    return unit, ["–" if v is None or v != v else significant(v * scale, zeros=True) for v in values]


def latency_cell(seconds: float | None) -> str:
    """A latency for a table: in ms below 10 s ("87.3 ms", "2,293 ms"), in s from 10 s up ("2,293 s"): never a
    seven-digit count of milliseconds."""
    from kvlab.report.tables import significant

    if seconds is None or seconds != seconds:
        return "–"
    if seconds >= 10:
        return f"{significant(seconds)} s"
    return f"{significant(seconds * 1e3)} ms"
