"""Iteration time (model.py), the profiles that set its constants (profiles.py) and the fit that makes one from a
real server's measurements (calibrate.py)."""

from kvlab.cost.model import PCIE_BANDWIDTH, CostModel, IterationCost
from kvlab.cost.profiles import DEFAULT_PROFILE, CostProfile, CostProfileWarning, builtin_profiles, get_profile

__all__ = [
           "DEFAULT_PROFILE",
           "PCIE_BANDWIDTH",
           "CostModel",
           "CostProfile",
           "CostProfileWarning",
           "IterationCost",
           "builtin_profiles",
           "get_profile",
]
