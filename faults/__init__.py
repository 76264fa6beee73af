"""Emulated unhealthy nodes: fault profiles, the operator-level fault emulator and the ABFT checker (docs/faults.md).

    from faults import emulated_node, load_profile

    with tracer, emulated_node(tracer, model, fault_profile=load_profile("rare-huge"), fault_seed=3, abft=True):
        ...

Importing `faults` imports none of the modules behind these names; each is imported when first used
(`tracer.exports`).
"""

from typing import TYPE_CHECKING

from tracer.exports import lazy_exports

__all__ = [
    "AbftChecker",
    "Corruption",
    "FaultEmulator",
    "FaultProfile",
    "FaultRule",
    "emulated_node",
    "load_profile",
    "node_header",
    "node_options",
    "profile_from_header",
    "shipped_profiles",
]

if TYPE_CHECKING:
    from faults.abft import AbftChecker
    from faults.emulator import FaultEmulator
    from faults.node import emulated_node, node_header, node_options
    from faults.profile import Corruption, FaultProfile, FaultRule, load_profile, profile_from_header, shipped_profiles
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "faults.profile": (
                "Corruption",
                "FaultProfile",
                "FaultRule",
                "load_profile",
                "profile_from_header",
                "shipped_profiles",
            ),
            "faults.emulator": ("FaultEmulator",),
            "faults.abft": ("AbftChecker",),
            "faults.node": ("emulated_node", "node_header", "node_options"),
        },
    )
