"""A fleet's files, drawn from the model its spec names: one profile per node, and fleet.md.

    nodes = drawn(FleetSpec(model="hardware"))       # faults.fleet_hardware's nodes
    write_fleet(FleetSpec(), Path("fleet"))          # node-01.toml ... and fleet.md (15 nodes, seed 1)

`faults.fleet` holds the study-calibrated model (the default), `faults.fleet_hardware`
the hardware-grounded one; both give the same bytes for the same spec.
"""

from __future__ import annotations

from pathlib import Path

from faults.fleet import FleetNode, FleetSpec, fleet, summary
from faults.fleet_hardware import HardwareNode, hardware_fleet, hardware_summary


def drawn(spec: FleetSpec) -> tuple[FleetNode, ...] | tuple[HardwareNode, ...]:
    """The spec's nodes, from the model it names."""
    return fleet(spec) if spec.model == "study" else hardware_fleet(spec)


def write_fleet(spec: FleetSpec, out: Path) -> list[Path]:
    """Write ``node-01.toml`` ... and ``fleet.md`` (one row per node) into ``out``; returns the profiles' paths."""
    nodes: tuple[FleetNode, ...] | tuple[HardwareNode, ...]
    if spec.model == "study":
        nodes = study = fleet(spec)
        table = summary(spec, study)
    else:
        nodes = hardware = hardware_fleet(spec)
        table = hardware_summary(spec, hardware)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for node in nodes:
        path = out / f"{node.label}.toml"
        path.write_text(node.text, encoding="utf-8")
        paths.append(path)
    (out / "fleet.md").write_text(table, encoding="utf-8")
    return paths
