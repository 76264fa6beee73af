"""`Guard`: what to watch for before each optimizer step, and what to do when it fires.

    with Tracer(model, optimizer, out="runs/a", run=RunInfo("node-7"), guard=Guard(on_deterministic="stop")) as tr:
        for step in range(steps):
            with tr.step(step, rerun=lambda: forward_backward(step)):   # zero the gradients, run the step again
                forward_backward(step)
                optimizer.step()

When a detector fires, the step's forward and backward run again from the same state, data
and RNG, before the optimizer steps, and the runs' gradient fingerprints are compared bit for
bit (`classify`):

- a re-run that differs from the first run and is confirmed by a later one: **transient**,
  the step goes on with the confirmed gradients;
- a re-run identical to the first run (or a later majority for it): **deterministic**, the
  data or the node reproduces it; ``on_deterministic`` says what follows;
- ``max_runs`` runs without two that agree: **unresolved**, handled like deterministic;
- no way to re-run (a Hugging Face Trainer): **unclassified**, likewise.

The policies: ``continue`` (the optimizer steps with the reproduced gradients), ``skip``
(every ``.grad`` is set to None, so the optimizer changes nothing; an LR scheduler stepped
after it still advances), ``stop`` (a checkpoint of the state before the step, if the run
has a directory, then `tracer.errors.GuardStop`). docs/guard.md has the state machine, the
``guard`` event and the measured defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal, get_args

from tracer.errors import ConfigError
from tracer.guard.detectors import AbftFlags, Alarm, Detector, GradNormSpike, LossSpike, NonFinite, UpdateRmsSpike
from tracer.guard.evidence import Evidence
from tracer.guard.ranks import Outcome
from tracer.guard.replicas import ReplicaAgreement

Policy = Literal["continue", "skip", "stop"]


@dataclass(frozen=True)
class Guard:
    """The detectors that look at each step, the policy for a fault that reproduces, and how many runs of
    one step (the first included) the guard may make to tell a transient fault from a deterministic one; and
    ``replicas``, the data-parallel replicas' agreement after each optimizer step (`tracer.guard.replicas`)."""

    detectors: tuple[Detector, ...] = field(default_factory=lambda: (NonFinite(), LossSpike(), GradNormSpike()))
    on_deterministic: Policy = "skip"
    max_runs: int = 3
    replicas: ReplicaAgreement | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "detectors", tuple(self.detectors))
        if not self.detectors:
            raise ConfigError("Guard(detectors=()): give at least one detector, e.g. tracer.guard.NonFinite()")
        for d in self.detectors:
            if not isinstance(d, Detector):
                raise ConfigError(f"Guard(detectors=...): {d!r} is no detector (it needs a name and check(evidence))")
        names = [d.name for d in self.detectors]
        if len(set(names)) != len(names):
            raise ConfigError(
                f"Guard(detectors=...): two detectors are named alike ({', '.join(names)}); give each kind once"
            )
        if self.on_deterministic not in get_args(Policy):
            raise ConfigError(
                f"Guard(on_deterministic={self.on_deterministic!r}): expected one of {', '.join(get_args(Policy))}"
            )
        if self.replicas is not None and not isinstance(self.replicas, ReplicaAgreement):
            raise ConfigError(f"Guard(replicas={self.replicas!r}): give a tracer.guard.ReplicaAgreement()")
        if self.max_runs < 2:
            raise ConfigError(f"Guard(max_runs={self.max_runs}): must be >= 2 (the first run and a re-run)")

    @property
    def keep(self) -> int:
        """How many accepted steps the detectors look back at."""
        return max((getattr(d, "window", 0) for d in self.detectors), default=0)

    @property
    def wants_update_rms(self) -> bool:
        return any(isinstance(d, UpdateRmsSpike) for d in self.detectors)

    def check(self, evidence: Evidence) -> list[Alarm]:
        """Every alarm the detectors raise on one run of a step."""
        return [a for a in (d.check(evidence) for d in self.detectors) if a is not None]

    def describe(self) -> dict[str, Any]:
        """What the run header's ``extra["guard"]`` records: every detector with its parameters, and the policy."""
        return {
            "detectors": [{"name": d.name, **_parameters(d)} for d in self.detectors],
            "on_deterministic": self.on_deterministic,
            "max_runs": self.max_runs,
            **({"replicas": self.replicas.describe()} if self.replicas is not None else {}),
        }


def default_guard(on_deterministic: Policy = "skip", *, abft: bool = False) -> Guard:
    """The detectors that cost nothing extra (`AbftFlags` too when the ABFT checker runs) and this policy:
    what ``sdc record --guard POLICY`` uses."""
    detectors: tuple[Detector, ...] = (NonFinite(), LossSpike(), GradNormSpike(), *((AbftFlags(),) if abft else ()))
    return Guard(detectors=detectors, on_deterministic=on_deterministic)


@dataclass(frozen=True)
class Verdict:
    """What the guard decided for a step on which a detector fired."""

    outcome: Outcome
    action: Policy
    accepted: int | None  # the run (attempt) whose gradients the optimizer steps with; None: skip or stop


def classify(fingerprints: Sequence[int], max_runs: int) -> Outcome | None:
    """The outcome after these runs' gradient fingerprints (first run first), or None: run once more.

    Two runs that agree decide; the first one to agree with an earlier run is always the newest, so one
    re-run decides an identical result and two decide a transient one."""
    newest = fingerprints[-1]
    if len(fingerprints) > 1 and fingerprints.count(newest) > 1:
        return "deterministic" if newest == fingerprints[0] else "transient"
    if len(fingerprints) >= max_runs:
        return "unresolved"
    return None


def verdict(outcome: Outcome, policy: Policy, newest: int) -> Verdict:
    """A transient fault continues with the confirmed (newest) run; anything else follows the policy."""
    action: Policy = "continue" if outcome == "transient" else policy
    return Verdict(outcome, action, newest if action == "continue" else None)


def _parameters(d: Detector) -> dict[str, Any]:
    instance: object = d  # mypy finds no dataclass that is a Detector (a protocol): ask of the object
    if not is_dataclass(instance):
        return {}
    out: dict[str, Any] = {}
    for f in fields(instance):
        value = getattr(d, f.name)
        out[f.name] = value if isinstance(value, int | float | str | bool) or value is None else repr(value)
    return out
