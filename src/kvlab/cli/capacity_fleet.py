"""``kvlab capacity --replicas auto`` lives in cli/capacity.py (the face) and kvlab/service/replicas.py (the search);
its figure in kvlab/report/replicas.py, whose ``replicas_figure`` is named here too for the callers that import it
from here (tests/test_capacity_replicas.py)."""

from kvlab.report.replicas import replicas_figure

__all__ = ["replicas_figure"]
