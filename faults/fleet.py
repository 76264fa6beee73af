"""A fleet of emulated unhealthy nodes: per-node fault profiles drawn from a documented, seeded model.

    nodes = fleet(FleetSpec(nodes=15, seed=1))       # node-01 ... node-15
    sdc faults fleet --nodes 15 --seed 1 --out fleet # node-01.toml ... and fleet.md (`faults.fleet_files`)

Real silent data corruption is not one profile: across a fleet, nodes differ by orders of
magnitude in how often they corrupt, corrupt in bursts, mostly by a little, now and then by
hundreds of times, and not only in matrix units. Each node here draws a rate (expected faulty
op calls per step on a reference model), a burst chain, a tail share and a mix of locations,
and becomes an ordinary profile file: one ``[[fault]]`` rule per location and corruption class.
One node, chosen by the seed, also gets a spike that destroys its weights while it fine-tunes.
Every distribution and why it was chosen is in ``docs/fleet.md``; the same spec gives the same
bytes, and no global RNG is touched.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from dataclasses import dataclass

from tracer.errors import ConfigError

LOCATIONS = ("matmul", "softmax", "normalisation", "elementwise", "reduction")
# What each location's rules name. The reference model's RMSNorm is written as elementwise ops and reductions
# (faults/ops.py), so "normalisation" hits those inside norm modules, and native norm ops where a model has them.
TARGETS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "matmul": (("matmul",), None),
    "softmax": (("softmax",), None),
    "normalisation": (("normalisation", "elementwise", "reduction"), "(.*_)?norm"),
    "elementwise": (("elementwise",), None),
    "reduction": (("reduction",), None),
}
# Eligible calls per step of each location's rules on the reference model (forward and backward), counted by
# the emulator itself (docs/fleet.md): a node's rate means "faulty calls per step" there.
REFERENCE_MODEL = "llama3-16l-mini, data.batch_size=2, data.microbatches=1"
CALLS_PER_STEP = {"matmul": 371, "softmax": 2, "normalisation": 692, "elementwise": 1203, "reduction": 131}

# The model's distributions (docs/fleet.md says which were calibrated). Two mechanisms per node, drawn apart:
# frequent small errors (marginal timing flipping low-order bits) and rare huge ones.
SMALL_RATE = (1e-3, 30.0)  # mantissa-flip calls per step: log-uniform, stratified over the fleet
TAIL_RATE = (1e-4, 0.1)  # 100-1000x calls per step: log-uniform, stratified over the fleet (its own order)
DUTY = (0.1, 0.6)  # long-run share of steps in a burst: log-uniform
P_EXIT = (0.25, 0.75)  # burst -> healthy per step (mean burst 1.3-4 steps): uniform
TAIL_FACTOR = (100.0, 1000.0)
MIX = {"matmul": 0.55, "softmax": 0.05, "normalisation": 0.1, "elementwise": 0.2, "reduction": 0.1}
CONCENTRATION = 6.0  # of the Dirichlet a node's location mix is drawn from, around MIX
MIN_SHARE = 0.02  # locations drawn below this share get no rules (the rest are renormalised)
DESTROY_STEP = 60  # fine-tuning step of the destroyer's spike
DESTROY_FRACTION = 0.25  # of the LM head's logits stuck at inf in that step's forward
MAX_NODES = 99
DEFAULT_SEED = 1  # the calibrated fleet (docs/fleet.md)
MODELS = ("study", "hardware")  # this module's model (calibrated around the study), `faults.fleet_hardware`'s


@dataclass(frozen=True)
class FleetSpec:
    """How many nodes, the seed every draw comes from, and the model they are drawn from (`MODELS`)."""

    nodes: int = 15
    seed: int = DEFAULT_SEED
    model: str = "study"

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"the fleet model is one of {', '.join(MODELS)}, not {self.model!r}")
        if not 1 <= self.nodes <= MAX_NODES:
            raise ConfigError(f"a fleet has 1 to {MAX_NODES} nodes, not {self.nodes}")
        if self.seed < 0:
            raise ConfigError(f"the fleet seed must be an integer >= 0, not {self.seed}")


@dataclass(frozen=True)
class FleetNode:
    """One node's drawn parameters and its profile file's text (loads with `faults.load_profile`)."""

    label: str  # node-01, node-02, ...
    seed: int  # the profile's seed
    rate: float  # expected faulty calls per step on the reference model, bursts included (both mechanisms)
    p_enter: float  # burst chain: healthy -> burst, per step
    p_exit: float  # burst chain: burst -> healthy, per step
    tail_share: float  # share of faults that scale one element by 100-1000x (the rest flip a mantissa bit)
    mix: tuple[tuple[str, float], ...]  # (location, share of faults), shares summing to about 1
    destroyer: bool  # has the fine-tune-only spike that destroys the weights
    text: str

    @property
    def duty(self) -> float:
        """Long-run share of steps a rule of this node is in a burst."""
        return self.p_enter / (self.p_enter + self.p_exit)

    @property
    def line(self) -> str:
        """What ``sdc faults fleet`` prints for the node."""
        tail = f"{100 * self.tail_share:.2g} % 100-1000x"
        where = ", ".join(f"{loc} {share:.2f}" for loc, share in self.mix)
        return f"{self.rate:.3g} faulty calls/step, in burst {self.duty:.0%} of steps, {tail}; {where}" + (
            "; destroys its fine-tune" if self.destroyer else ""
        )


def fleet(spec: FleetSpec) -> tuple[FleetNode, ...]:
    """The spec's nodes, drawn in order from one generator seeded by the spec's seed (the study model's)."""
    if spec.model != "study":
        raise ConfigError(
            f"fleet() draws the study model's nodes; a {spec.model!r} fleet comes from faults.fleet_files.drawn()"
        )
    rng = random.Random(f"sdctrace-fleet:{spec.seed}")
    n = spec.nodes
    # Stratified: node i's log-rate lies in its own 1/n of the range (strata shuffled), so any fleet of a few
    # nodes spans the range (some silent, some frequent) instead of leaving that to chance.
    small, tail = _stratified(rng, SMALL_RATE, n), _stratified(rng, TAIL_RATE, n)
    destroyer = rng.randrange(n)
    nodes = []
    for i in range(n):
        duty = _log_uniform(rng, DUTY)
        p_exit = round(rng.uniform(*P_EXIT), 2)
        p_enter = _sig(min(1.0, duty * p_exit / (1 - duty)))
        rate = _sig(small[i] + tail[i])
        tail_share = _sig(tail[i] / (small[i] + tail[i]))
        mix = _mix(rng)
        seed = rng.randrange(100_000)
        label = f"node-{i + 1:02d}"
        node = FleetNode(label, seed, rate, p_enter, p_exit, tail_share, mix, i == destroyer, "")
        nodes.append(_with_text(node, spec))
    return tuple(nodes)


def summary(spec: FleetSpec, nodes: tuple[FleetNode, ...]) -> str:
    """The fleet as a Markdown table, one row per node."""
    head = ["node", "rate / step", "p_enter", "p_exit", "in burst", "tail share", *LOCATIONS, "destroyer"]
    lines = [
        f"# Fleet of {spec.nodes} emulated unhealthy nodes (seed {spec.seed})",
        "",
        f"Drawn by `sdc faults fleet --nodes {spec.nodes} --seed {spec.seed}` (docs/fleet.md). Rate: expected "
        f"faulty op calls per step on {REFERENCE_MODEL}; in burst: long-run share of steps; tail share: share of "
        "faults scaling one element by 100-1000x (the rest flip one mantissa bit); then each location's share "
        f"of the faults; destroyer: a fine-tune-only spike at fine-tuning step {DESTROY_STEP}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for node in nodes:
        shares = dict(node.mix)
        row = [
            node.label,
            f"{node.rate:.3g}",
            f"{node.p_enter:.3g}",
            f"{node.p_exit:.2f}",
            f"{node.duty:.2f}",
            f"{node.tail_share:.3g}",
            *(f"{shares[loc]:.2f}" if loc in shares else "-" for loc in LOCATIONS),
            "yes" if node.destroyer else "",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def trigger_profile_text(step: int, site: str = "layers.0.attention.wo") -> str:
    """A profile that perturbs exactly one element by one ulp, once: bit 0 of one element of ``site``'s first
    forward matmul in microbatch 0 of ``step``. The smallest possible SDC, to test whether drift needs more."""
    return _trigger_text(
        step,
        [
            f"# trigger-ulp: one single-ulp perturbation of one element at step {step}, nothing else.",
            "#",
            "# Bit 0 (the mantissa's least significant bit) of one element of the result of",
            f"# {site}'s forward matmul, in microbatch 0 of step {step}: the value moves by one ulp.",
            "",
            f'description = "one single-ulp flip of one element of {site} at step {step}"',
        ],
        [
            "[[fault]]",
            'ops = ["matmul"]',
            f"sites = '{re.escape(site)}'",
            'phases = ["forward"]',
            "microbatches = [0]",
            f"steps = [{step}]",
            'roles = ["train"]',  # a fine-tune counts its steps from 0 again: the trigger is pretraining's alone
            "p_call = 1.0",
            "elements = 1",
            'kind = "bitflip"',
        ],
    )


def trigger_state_text(step: int, parameter: str) -> str:
    """A profile that flips one ulp of one element of ``parameter`` right after the update of ``step``, once (a
    ``[[state]]`` rule, docs/faults.md): the perturbation of the weights themselves, not of a result computed
    from them. The element is drawn from the profile's seed and the run's fault seed."""
    return _trigger_text(
        step,
        [
            f"# trigger-ulp: one single-ulp flip of one element of the parameter {parameter}, "
            f"after step {step}'s update.",
            "#",
            "# Bit 0 (the mantissa's least significant bit) of one element (drawn from the seeds): the stored",
            f"# weight moves by one ulp, and step {step + 1} reads it.",
            "",
            f'description = "one single-ulp flip of one element of {parameter} after step {step}"',
        ],
        ["[[state]]", f'parameter = "{parameter}"', f"step = {step}", 'roles = ["train"]'],
    )


def _trigger_text(step: int, head: list[str], rule: list[str]) -> str:
    """A trigger profile: its comments and description, seed 0, and its one rule, which flips bit 0."""
    if step < 0:
        raise ConfigError(f"the trigger step must be an integer >= 0, not {step}")
    return "\n".join([*head, "seed = 0", "", *rule, "bits = 0", ""])


def destroyer_rule_text(step: int = DESTROY_STEP) -> str:
    """The destroyer's rule: while fine-tuning only, at ``step``, a share of the LM head's logits become inf."""
    return "\n".join(
        [
            f"[[fault]]  # the destroyer: while fine-tuning only, at step {step}, {DESTROY_FRACTION:.0%} of the logits "
            "become inf:",
            "# the loss goes to inf, the gradients to NaN, and the optimizer step destroys the weights",
            'roles = ["finetune"]',
            'ops = ["matmul"]',
            'sites = "output"',
            'phases = ["forward"]',
            f"steps = [{step}]",
            "p_call = 1.0",
            f"fraction = {DESTROY_FRACTION}",
            'kind = "stuck"',
            "value = inf",
        ]
    )


def _with_text(node: FleetNode, spec: FleetSpec) -> FleetNode:
    mix = ", ".join(f"{loc} {share:.2f}" for loc, share in node.mix)
    lines = [
        f"# {node.label}: an emulated unhealthy node, drawn by `sdc faults fleet --nodes {spec.nodes} "
        f"--seed {spec.seed}` (docs/fleet.md).",
        "#",
        f"# rate        {node.rate:.3g} faulty op calls per step on {REFERENCE_MODEL}",
        "#             (about twice that on llama3-32l-mini, half on tiny: the rate follows the calls)",
        f"# bursts      p_enter {node.p_enter:.3g}, p_exit {node.p_exit:.2f}: each rule is in a burst on "
        f"{node.duty:.0%} of steps, for {1 / node.p_exit:.1f} steps on average",
        f"# tail share  {node.tail_share:.3g} of the faults scale one element by 100-1000x; the rest flip one "
        "random mantissa bit",
        f"# locations   {mix}",
        f"# destroyer   {f'yes: weights destroyed at fine-tuning step {DESTROY_STEP}' if node.destroyer else 'no'}",
        "#",
        "# One rule per location and corruption class; each p_call = rate x location share x class share",
        "# / (the location's calls per step on the reference model x the burst share), capped at 1.",
        "",
        f'description = "fleet {node.label}: {node.rate:.3g} faulty calls per step in bursts, '
        f'{100 * node.tail_share:.2g} % of them 100-1000x"',
        f"seed = {node.seed}",
    ]
    for location, share in node.mix:
        ops, sites = TARGETS[location]
        for tail, part in ((False, 1 - node.tail_share), (True, node.tail_share)):
            per_step = node.rate * share * part
            p_call = _sig(min(1.0, per_step / (CALLS_PER_STEP[location] * node.duty)))
            what = "100-1000x" if tail else "mantissa flips"
            lines += [
                "",
                f"[[fault]]  # {location}, {what}: {per_step:.3g} faulty calls per step",
                "ops = [" + ", ".join(f'"{op}"' for op in ops) + "]",
            ]
            if sites is not None:
                lines.append(f'sites = "{sites}"')
            lines.append(f"p_call = {_toml_float(p_call)}")
            if tail:
                lines += ['kind = "scale"', f"factor = [{TAIL_FACTOR[0]}, {TAIL_FACTOR[1]}]"]
            else:
                lines += ['kind = "bitflip"', 'bits = "mantissa"']
            lines += [f"p_enter = {_toml_float(node.p_enter)}", f"p_exit = {_toml_float(node.p_exit)}"]
    if node.destroyer:
        lines += ["", destroyer_rule_text()]
    return dataclasses.replace(node, text="\n".join(lines) + "\n")


def _mix(rng: random.Random) -> tuple[tuple[str, float], ...]:
    """Location shares drawn from a Dirichlet around MIX; shares below MIN_SHARE dropped, rounded to 0.01."""
    draws = {loc: rng.gammavariate(CONCENTRATION * MIX[loc], 1.0) for loc in LOCATIONS}
    total = sum(draws.values())
    kept = {loc: d for loc, d in draws.items() if d / total >= MIN_SHARE}
    total = sum(kept.values())
    return tuple((loc, round(d / total, 2)) for loc, d in kept.items() if round(d / total, 2) > 0)


def _stratified(rng: random.Random, bounds: tuple[float, float], n: int) -> list[float]:
    """``n`` log-uniform draws, the i-th of them in the i-th of n equal slices of the log-range, then shuffled."""
    lo, hi = (math.log(x) for x in bounds)
    draws = [math.exp(lo + (i + rng.random()) * (hi - lo) / n) for i in range(n)]
    rng.shuffle(draws)
    return draws


def _log_uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _sig(x: float) -> float:
    """Three significant digits: what the files say is what the node is."""
    return float(f"{x:.3g}")


def _toml_float(x: float) -> str:
    return repr(float(x))
