"""The front door: one entry per question a face asks, so one question gets one answer wherever it is asked.

    engine.py    run: a resolved configuration and strategies in, results out (start/finish for a face that
                 steps the engine itself; run_fleets for --replicas N)         kvlab run, race, the lab, sweeps
    size.py      size: the one builder of a SizingConfig from the sizing options  kvlab size, fit, the calculator
    capacity.py  capacity: the highest rate each configuration sustains, searched over the sweep store
                                                                                   kvlab capacity
    replicas.py  the fewest replicas that sustain a rate, each count a fleet run through run_fleets (its work
                 checked), stored in the sweep store and resumed after Ctrl-C     kvlab capacity --replicas auto
    bench.py     the bench workload: the requests sent to a real server          kvlab bench
    verdict.py   who won a race, and what is a tie                               kvlab race, the lab's finish line

``from kvlab import service; service.run(...)`` runs (engine.py's names are re-exported here, the only ones: the
other entries import what they need and are imported by name, so that `kvlab size` starts without them).
"""

from kvlab.service.engine import (
    Progress,
    RunResult,
    check_work,
    finish,
    load,
    notes,
    run,
    run_fleets,
    simulate,
    start,
    strategies,
)

__all__ = ["Progress", "RunResult", "check_work", "finish", "load", "notes", "run", "run_fleets", "simulate", "start",
           "strategies"]
