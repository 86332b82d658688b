"""Sweeps and capacity search: many `kvlab run` points, on local processes or a Ray cluster, stored in DuckDB.

    grid.py      options (comma lists, grid files) -> points, checked against `kvlab run` before anything runs
    point.py     one point -> one simulation's summary (the one adapter to the simulator)
    store.py     DuckDB: one row per point, keyed by a hash of its options and kvlab's version
    runner.py    local worker processes or Ray; results stored as they arrive; stored points never recomputed
    capacity.py  the highest rate that meets a latency target: bracketing, then bisection
    plots.py     latency against rate (Figure 12's layout) and capacity bars, PNG; html.py the same, interactive
"""
