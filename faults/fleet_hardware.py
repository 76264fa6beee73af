"""The hardware-grounded fleet model: node profiles drawn from published GPU measurements, not from the study.

    nodes = hardware_fleet(FleetSpec(model="hardware"))   # node-01 ... node-15
    write_fleet(FleetSpec(model="hardware"), Path("fleet"))   # faults.fleet_files
    sdc faults fleet --model hardware --nodes 15 --seed 1 --out fleet

The default fleet model (`faults.fleet`) was shaped around the reference study's own
findings. This one takes what it can from measurements made elsewhere, and says where
it had to choose (docs/fleet.md has the table: parameter, value, source, verified or
quoted):

- each node is one defective device;
- the defect sits in one unit (one location: the matmul unit for half the nodes, else
  another drawn in proportion to its calls) and is a stuck-at one (the gate-level
  stuck-at injection of "The Anatomy of SDC", arXiv 2605.04213): permanent, so it fires
  at a steady rate, with no bursts, and a guard's re-run of a step repeats its faults
  (``persistent``; docs/fleet.md says why steady and not intermittent);
- of its faulty outputs, 1.01 % are NaN or +-Inf (Anatomy of SDC), the rest bit flips,
  of which under 40 % flip a single bit (Anatomy of SDC); the others flip 2-4 bits;
- corrupted addresses are periodic, warp-aligned (Anatomy of SDC): a node drawn periodic
  hits 4 elements of a result 32 apart (one lane of each of 4 warps);
- bits anywhere in the word (no position distribution is published in what we could read).

Rates (faulty calls per step) have no published per-step figure; they are drawn
log-uniformly over a wide range, not stratified and not tuned on any study figure.
`SOURCES` says, for every parameter, the figure a source gives or that it is the project's choice;
`hardware_summary` prints it under the fleet's table. The same spec gives the same bytes; no global RNG is touched.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from faults.fleet import CALLS_PER_STEP, LOCATIONS, REFERENCE_MODEL, TARGETS, FleetSpec

NAN_INF_SHARE = 0.0101  # of SDC outcomes that are NaN, +Inf or -Inf (Anatomy of SDC, abstract)
SINGLE_BIT_SHARE = 0.35  # of bit-flip outcomes that flip one bit: "less than 40 %" (Anatomy of SDC); 0.35 is ours
MULTI_BIT_FLIPS = (2, 4)  # bits a multi-bit outcome flips: ours (the abstract gives no distribution)
WARP = 32  # the stride of a periodic (warp-aligned) node's hits: ours, from "warp-aligned" (Anatomy of SDC)
PERIODIC_ELEMENTS = 4  # elements a periodic node corrupts per faulty call: ours
PERIODIC_SHARE = 0.5  # of nodes whose corruptions are periodic: ours (the abstract says periodicity exists)
RATE = (1e-3, 3.0)  # faulty calls per step on the reference model, log-uniform: ours, untuned
TENSOR_CORE_SHARE = 0.5  # of nodes whose defect is in the matmul unit (2604.00726 injects there): ours
# The other nodes' defect is in another unit, drawn in proportion to its eligible calls per step: ours.
_OTHER_CALLS = {loc: CALLS_PER_STEP[loc] for loc in LOCATIONS if loc != "matmul"}
_NON_FINITE = ("nan", "inf", "-inf")  # the abstract groups NaN/+INF/-INF; equal thirds are ours

ANATOMY = '"The Anatomy of Silent Data Corruption", arXiv 2605.04213 (DSN 2026), abstract'
CHOICE = "the project's choice"
# (parameter, value, where it comes from): a source with the figure it gives, or CHOICE. docs/fleet.md has the same
# table with the quotes, and why the rate is steady.
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("NaN/+-Inf share of faulty outputs", f"{100 * NAN_INF_SHARE:.3g} %", f'{ANATOMY}: "1.01% of SDC outcomes"'),
    ("NaN, +Inf, -Inf split", "a third each", CHOICE),
    (
        "single-bit share of bit flips",
        f"{100 * SINGLE_BIT_SHARE:.3g} %",
        f'{ANATOMY}: "less than 40%"; 35 % is {CHOICE}',
    ),
    ("bits a multi-bit flip changes", f"{MULTI_BIT_FLIPS[0]}-{MULTI_BIT_FLIPS[1]}, uniform", CHOICE),
    ("bit positions", "uniform over the word", CHOICE),
    (
        "periodic addresses",
        f"stride {WARP}, {PERIODIC_ELEMENTS} elements, {100 * PERIODIC_SHARE:.3g} % of nodes",
        f'{ANATOMY}: "periodicity", "warp-aligned"; stride, count and share are {CHOICE}',
    ),
    (
        "defect type",
        "stuck-at: steady rate, no bursts, repeated on re-run",
        f'{ANATOMY}: "stuck-at fault injection"; steady because stuck-at is permanent (docs/fleet.md)',
    ),
    (
        "defect in the matmul unit",
        f"{100 * TENSOR_CORE_SHARE:.3g} % of nodes",
        'Altenbernd et al., arXiv 2604.00726, abstract: "fault injection at the level of GPU matrix-multiply '
        f'instructions"; the share is {CHOICE}',
    ),
    ("other units", "in proportion to their calls per step", CHOICE),
    ("rate", f"log-uniform in [{RATE[0]:g}, {RATE[1]:g}] faulty calls per step", f"{CHOICE}, untuned"),
)


@dataclass(frozen=True)
class HardwareNode:
    """One node of the hardware model: its drawn parameters and its profile file's text."""

    label: str  # node-01, node-02, ...
    seed: int  # the profile's seed
    rate: float  # expected faulty calls per step on the reference model
    location: str  # the unit whose defect it is (one of `faults.fleet.LOCATIONS`)
    periodic: bool  # hits every WARP-th element, PERIODIC_ELEMENTS at a time (else one element per call)
    text: str

    @property
    def line(self) -> str:
        """What ``sdc faults fleet`` prints for the node."""
        pattern = f"{PERIODIC_ELEMENTS} elements a call, stride {WARP}" if self.periodic else "one element a call"
        return f"{self.rate:.3g} faulty calls/step, steady, in {self.location}; {pattern}"


def outcome_shares() -> tuple[tuple[str, float], ...]:
    """(outcome, share of a node's faulty calls): single-bit flips, multi-bit flips, NaN, +Inf, -Inf."""
    flips = 1 - NAN_INF_SHARE
    return (
        ("single-bit", flips * SINGLE_BIT_SHARE),
        ("multi-bit", flips * (1 - SINGLE_BIT_SHARE)),
        *((value, NAN_INF_SHARE / len(_NON_FINITE)) for value in _NON_FINITE),
    )


def hardware_fleet(spec: FleetSpec) -> tuple[HardwareNode, ...]:
    """The spec's nodes, drawn in order from one generator seeded by the spec's seed (and the model's name)."""
    rng = random.Random(f"sdctrace-fleet-hardware:{spec.seed}")
    lo, hi = (math.log(x) for x in RATE)
    nodes = []
    for i in range(spec.nodes):
        rate = float(f"{math.exp(rng.uniform(lo, hi)):.3g}")
        location = (
            "matmul"
            if rng.random() < TENSOR_CORE_SHARE
            else rng.choices(list(_OTHER_CALLS), weights=list(_OTHER_CALLS.values()))[0]
        )
        periodic = rng.random() < PERIODIC_SHARE
        node = HardwareNode(f"node-{i + 1:02d}", rng.randrange(100_000), rate, location, periodic, "")
        nodes.append(HardwareNode(node.label, node.seed, rate, location, periodic, _text(node, spec)))
    return tuple(nodes)


def hardware_summary(spec: FleetSpec, nodes: tuple[HardwareNode, ...]) -> str:
    """The fleet as a Markdown table, one row per node."""
    head = ["node", "rate / step", "location", "pattern"]
    lines = [
        f"# Fleet of {spec.nodes} emulated defective devices, hardware model (seed {spec.seed})",
        "",
        f"Drawn by `sdc faults fleet --model hardware --nodes {spec.nodes} --seed {spec.seed}` (docs/fleet.md). "
        f"Rate: expected faulty op calls per step on {REFERENCE_MODEL}, steady (stuck-at defects, no bursts). "
        f"Every node's faulty outputs: {_shares_said()}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for node in nodes:
        pattern = f"{PERIODIC_ELEMENTS} elements, stride {WARP}" if node.periodic else "one element"
        lines.append(f"| {node.label} | {node.rate:.3g} | {node.location} | {pattern} |")
    lines += ["", "Where each parameter comes from (a source and the figure it gives, or the project's choice):", ""]
    lines += [f"- {name}: {value}. Source: {source}." for name, value, source in SOURCES]
    return "\n".join(lines) + "\n"


def _shares_said() -> str:
    return ", ".join(f"{name} {100 * share:.3g} %" for name, share in outcome_shares())


def _text(node: HardwareNode, spec: FleetSpec) -> str:
    ops, sites = TARGETS[node.location]
    calls = CALLS_PER_STEP[node.location]
    lines = [
        f"# {node.label}: an emulated defective device, hardware model, drawn by `sdc faults fleet --model hardware "
        f"--nodes {spec.nodes} --seed {spec.seed}` (docs/fleet.md).",
        "#",
        f"# rate        {node.rate:.3g} faulty op calls per step on {REFERENCE_MODEL}",
        "#             steady (a stuck-at defect: no bursts; a re-run of a step repeats its faults)",
        f"# location    {node.location} (the defect is in one unit)",
        f"# pattern     {node.line.split('; ')[1]}",
        f"# outcomes    {_shares_said()} (Anatomy of SDC, arXiv 2605.04213)",
        "",
        f'description = "hardware {node.label}: {node.rate:.3g} faulty calls per step in {node.location}, '
        f'{"periodic" if node.periodic else "single elements"}"',
        f"seed = {node.seed}",
    ]
    for outcome, share in outcome_shares():
        per_step = node.rate * share
        p_call = min(1.0, per_step / calls)
        lines += [
            "",
            f"[[fault]]  # {node.location}, {outcome}: {per_step:.3g} faulty calls per step",
            "ops = [" + ", ".join(f'"{op}"' for op in ops) + "]",
        ]
        if sites is not None:
            lines.append(f'sites = "{sites}"')
        lines.append(f"p_call = {float(f'{p_call:.3g}')!r}")
        lines += [f"elements = {PERIODIC_ELEMENTS}", f"stride = {WARP}"] if node.periodic else []
        if outcome == "single-bit":
            lines += ['kind = "bitflip"', 'bits = "random"']
        elif outcome == "multi-bit":
            lines += ['kind = "bitflip"', 'bits = "random"', f"flips = [{MULTI_BIT_FLIPS[0]}, {MULTI_BIT_FLIPS[1]}]"]
        else:
            lines += ['kind = "stuck"', f"value = {outcome}"]
        lines.append("persistent = true")
    return "\n".join(lines) + "\n"
