"""Iteration time (model.py), the profiles that set its constants (profiles.py) and the fit that makes one from a
real server's measurements (calibrate.py), and how far a fitted profile's predictions are from the real engine
(band.py: ``error_band(profile)``)."""

from kvlab.cost.band import ErrorBand, error_band
from kvlab.cost.model import PCIE_BANDWIDTH, CostModel, IterationCost
from kvlab.cost.profiles import DEFAULT_PROFILE, CostProfile, CostProfileWarning, builtin_profiles, get_profile

__all__ = [
           "DEFAULT_PROFILE",
           "PCIE_BANDWIDTH",
           "CostModel",
           "CostProfile",
           "CostProfileWarning",
           "ErrorBand",
           "IterationCost",
           "builtin_profiles",
           "error_band",
           "get_profile",
]
