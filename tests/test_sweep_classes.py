"""A stored sweep point whose workload has request classes (--priority-classes, a file's priority column) keeps
each class's entry (kvlab.service.classes) and the class of each of its window's judged requests, in the order of
its window latencies: a sweep with classes can be judged per class later, from the store alone."""

from __future__ import annotations

import json

import numpy as np

import kvlab
from kvlab.sweep.grid import expand, row_kinds
from kvlab.sweep.point import compute, resolve_point
from kvlab.sweep.store import Store
from kvlab.window import LATENCY_METRICS


def test_a_point_with_classes_stores_them_beside_its_window_latencies():
    (point,) = expand({"strategy": ["vllm"], "rate": ["6"], "num_requests": ["300"], "cost": ["roofline"],
                       "num_gpu_blocks": ["300"], "priority_classes": ["0:0.3,1:0.7"], "timeout": ["1:20"]})
    outcome = compute(point)
    assert outcome["error"] is None
    summary = outcome["summary"]
    assert list(summary["classes"]) == ["0", "1"]
    assert sum(c["num_requests"] for c in summary["classes"].values()) == 300
    assert summary["classes"]["0"]["num_aborted"] == 0  # (class 0 has no deadline)
    latencies = np.frombuffer(outcome["latencies"], dtype=np.float64).reshape(len(LATENCY_METRICS), -1)
    assert len(summary["window_classes"]) == latencies.shape[1] and set(summary["window_classes"]) == {0, 1}
    store = Store(None, row_kinds())
    resolved = resolve_point(point, kvlab.__version__)
    store.add(resolved.key, point, outcome, kvlab.__version__)
    (row,) = store.rows([resolved.key])
    assert json.loads(row["classes"]) == summary["classes"]
    assert json.loads(row["summary"])["window_classes"] == summary["window_classes"]


def test_a_point_of_one_class_stores_none():
    (point,) = expand({"strategy": ["vllm"], "rate": ["2"], "num_requests": ["50"], "cost": ["roofline"]})
    summary = compute(point)["summary"]
    assert "classes" not in summary and "window_classes" not in summary
