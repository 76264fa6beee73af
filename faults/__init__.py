"""Emulated unhealthy nodes: fault profiles and the operator-level fault emulator."""

from faults.emulator import FaultEmulator
from faults.profile import Corruption, FaultProfile, FaultRule, load_profile, profile_from_header, shipped_profiles

__all__ = [
    "Corruption",
    "FaultEmulator",
    "FaultProfile",
    "FaultRule",
    "load_profile",
    "profile_from_header",
    "shipped_profiles",
]
