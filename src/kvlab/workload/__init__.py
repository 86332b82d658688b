"""Workloads: the requests a simulation (or a real engine) serves.

    load_workload("paper-sharegpt", rate=2.0, duration=3600, seed=0)   # kvlab's stand-in, Poisson arrivals
    load_workload("azure-conv", num_requests=1000)                      # a published trace (a copy: kvlab workloads fetch)
    load_workload("my_requests.csv")                                    # a user's file

``WORKLOADS`` names kvlab's own workloads and the published traces it reads; ``list_workloads()`` summarises them.
docs/workloads.md tells where each comes from and how the paper stand-ins were fitted.
"""

from kvlab.workload.bundled import KINDS, WORKLOADS, BundledWorkload, WorkloadInfo, list_workloads
from kvlab.workload.load import ARRIVALS, DEFAULT_NUM_REQUESTS, load_workload
from kvlab.workload.request import Request
from kvlab.workload.workload import Workload

__all__ = [
    "ARRIVALS",
    "DEFAULT_NUM_REQUESTS",
    "KINDS",
    "WORKLOADS",
    "BundledWorkload",
    "Request",
    "Workload",
    "WorkloadInfo",
    "list_workloads",
    "load_workload",
]
