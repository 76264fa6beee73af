"""Where each finding of the reproduction table comes from: built into the fault model, calibrated, or emergent.

    rules = LIBRARY.run(db, "rq1_fleet_profiles").records()   # every fault rule of every node's profile
    heavy_tail(rules)        # Provenance("built in", "5 of 5 nodes have a scale rule of 100-1000x")

A finding the fault model states as a parameter proves nothing about training when the table
reproduces it: *built in* (the feature is a parameter of the fault model), *calibrated* (a
parameter was tuned on the study's own figure), *emergent* (it comes out of the training
dynamics; only these test the tool). Each function here decides one kind of finding from the
profiles the fleet's runs recorded (the `rq1_fleet_profiles` query), so another fault model
gets its own answer; docs/study.md explains every row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from analysis.reproduction_rules import Rows, is_fleet_node

Kind = Literal["built in", "calibrated", "emergent", "unknown"]  # unknown: no profiles to read
TAIL = (100.0, 1000.0)  # the study's "hundreds to thousands of times off"
NON_FINITE = ("nan", "inf", "infinity")  # a stuck rule's value, as the profile's JSON spells it (sign aside)
MANTISSA_SHARE = 23 / 32  # float32's mantissa bits over its width: a uniform flip's chance of staying small
CHOSEN = "the project's own choice"  # how a row names a parameter nobody published


@dataclass(frozen=True)
class Provenance:
    kind: Kind
    why: str  # in words, from the profiles


def _fleet(rules: Rows) -> Rows:
    return [r for r in rules if is_fleet_node(r["node_label"]) and (r["p_call"] or 0) > 0]


def _drawn(rules: Rows) -> Rows:
    """The fleet's rules that fire at random in pretraining, where RQ1 and RQ2 look: not scripted (no `steps`), and
    not limited to other roles (the destroyer's fine-tuning rule)."""
    return [r for r in _fleet(rules) if r["steps"] is None and (r["roles"] is None or "train" in r["roles"])]


def _nodes(rules: Rows) -> list[str]:
    return sorted({r["node_label"] for r in rules})


def _tail(rules: Rows) -> Rows:
    return [
        r
        for r in rules
        if r["kind"] == "scale"
        and r["factor_max"] is not None
        and r["factor_max"] >= TAIL[0]
        and r["factor_min"] <= TAIL[1]
    ]


def _nonfinite(rules: Rows) -> Rows:
    """Stuck rules that write NaN or +-Inf."""
    return [r for r in rules if r["kind"] == "stuck" and (r.get("value") or "").lower().lstrip("+-") in NON_FINITE]


def _exponent(rules: Rows) -> Rows:
    """Bit flips that can hit an exponent bit: bits "exponent", or "random" (uniform over the word)."""
    return [r for r in rules if r["kind"] == "bitflip" and r["bits"] in ("exponent", "random")]


def rate_spread(rules: Rows) -> Provenance:
    """Silent and frequent nodes: built in when the nodes' rates (sum of their rules' p_call) span 100x or more,
    so that the draw itself makes some nodes near-silent and some frequent. The range the rates are drawn from is
    the project's own choice in every fault model (docs/fleet.md), and is labelled so."""
    fleet = _drawn(rules)
    rates = {n: sum(r["p_call"] for r in fleet if r["node_label"] == n) for n in _nodes(fleet)}
    if len(rates) < 2:
        return Provenance("emergent", "fewer than two nodes with faults in their profiles")
    spread = max(rates.values()) / min(rates.values())
    if spread < 100:
        return Provenance("emergent", f"the nodes' summed p_call spans only {spread:.3g}x")
    return Provenance(
        "built in", f"the nodes' summed p_call spans {spread:.3g}x; the rates' range is {CHOSEN} (docs/fleet.md)"
    )


def injected_counts(rules: Rows) -> Provenance:
    """Bursts: built in for every fault model, because the rule counts the faults the emulator injected (its fault
    events), not what the tool measured: it reads back the fault model's draw. The burst chain (p_enter < 1) says
    whether that draw is bursty."""
    fleet = _drawn(rules)
    chained = _nodes([r for r in fleet if r["p_enter"] is not None and r["p_enter"] < 1])
    return Provenance(
        "built in",
        f"{len(chained)} of {len(_nodes(fleet))} nodes' rules follow a burst chain (p_enter < 1), and the rule "
        "counts the injected faults (fault events), so it reads the fault model's draw back, whatever the model",
    )


def small_flips(rules: Rows) -> Provenance:
    """Small perturbations: built in when most of the rules' p_call weight flips mantissa bits only: a rule of
    mantissa flips counts whole, a flip at a uniform position ("random") by the share of float32's bits that are
    mantissa, 23 of 32, once per bit it flips. Uniform positions are the project's own choice (no published
    distribution), and are labelled so."""
    fleet = _drawn(rules)
    total = sum(r["p_call"] for r in fleet)
    if not total:
        return Provenance("emergent", "no fault rule fires")
    weight = 0.0
    for r in fleet:
        if r["kind"] == "bitflip" and r["bits"] == "mantissa":
            weight += r["p_call"]
        elif r["kind"] == "bitflip" and r["bits"] == "random":
            weight += r["p_call"] * MANTISSA_SHARE ** _min_flips(r)
    share = weight / total
    uniform = any(r["kind"] == "bitflip" and r["bits"] == "random" for r in fleet)
    why = f"{100 * share:.3g} % of the rules' p_call flips mantissa bits only" + (
        f" (uniform bit positions, {MANTISSA_SHARE * 32:.0f} of 32 bits mantissa: {CHOSEN}, uncited)" if uniform else ""
    )
    return Provenance("built in" if share > 0.5 else "emergent", why)


def _min_flips(rule: Mapping[str, Any]) -> int:
    flips = rule.get("flips")
    if isinstance(flips, str):
        flips = json.loads(flips)
    if isinstance(flips, list) and flips:
        return int(flips[0])
    return int(flips) if isinstance(flips, int | float) else 1


def heavy_tail(rules: Rows) -> Provenance:
    """100-1000x elements: built in when a drawn rule scales elements by a factor in that range, writes NaN or
    +-Inf, or flips exponent bits (bits "exponent", or "random": uniform over the word, so some flips land in the
    exponent and move a value by up to 2^128)."""
    fleet = _drawn(rules)
    causes = [
        (len(_nodes(_tail(fleet))), "a scale rule of 100-1000x"),
        (len(_nodes(_nonfinite(fleet))), "NaN/Inf outputs"),
        (len(_nodes(_exponent(fleet))), "exponent-bit flips"),
    ]
    said = "; ".join(f"{n} of {len(_nodes(fleet))} nodes have {what}" for n, what in causes if n)
    if not said:
        return Provenance("emergent", f"none of {len(_nodes(fleet))} nodes has a 100-1000x, NaN/Inf or exponent rule")
    return Provenance("built in", said)


def outside_matmul(rules: Rows) -> Provenance:
    """ABFT missing faults: built in when rules place faults in ops no matmul checksum covers."""
    fleet = _drawn(rules)
    outside = [r for r in fleet if "matmul" not in (r["ops"] or "")]
    return Provenance(
        "built in" if outside else "emergent",
        f"{len(outside)} of {len(fleet)} rules hit ops outside matmul, which ABFT does not check",
    )


def tail_rate(rules: Rows) -> Provenance:
    """RQ2's worst noise: calibrated when the fleet has the 100-1000x tail, whose rate bound and fleet seed were
    tuned to land near the study's 5.1 % (docs/fleet.md); built in when NaN/Inf outputs or exponent-bit flips make
    the worst step whatever it is; emergent for a fault model with neither."""
    fleet = _drawn(rules)
    if _tail(fleet):
        return Provenance("calibrated", "the tail's rate bound and the fleet seed were chosen to land near 5.1 %")
    if _nonfinite(fleet) or _exponent(fleet):
        return Provenance("built in", "NaN/Inf outputs and exponent-bit flips set the worst step's noise")
    return Provenance("emergent", "no 100-1000x, NaN/Inf or exponent rule, so nothing was tuned on 5.1 %")


def scripted_destroyer(rules: Rows) -> Provenance:
    """The destroyed fine-tune: built in when a rule scripts it (names its steps and the finetune role)."""
    scripted = _nodes([r for r in _fleet(rules) if r["steps"] is not None and "finetune" in (r["roles"] or "")])
    if scripted:
        return Provenance("built in", f"{', '.join(scripted)} scripts the spike (a rule naming its fine-tuning step)")
    return Provenance("emergent", "no rule scripts a fine-tuning spike")


def emergent(rules: Rows) -> Provenance:
    """Drift, loss curves, accuracy, the trigger: no rule states them; they come out of training."""
    return Provenance("emergent", "no rule of the fault model states it: training dynamics")
