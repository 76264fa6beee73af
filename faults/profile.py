"""Fault profiles: TOML files that describe an emulated unhealthy node.

    profile = load_profile("bursty-mismatch")          # a shipped profile, or a path
    print(profile.faults[0].corruption.kind)

A profile is a description, a seed and a list of ``[[fault]]`` rules; each rule
says which ops (and module paths) it hits, in which phases, how often, how many
elements, what corruption, and on which steps. ``[[state]]`` rules flip one bit of
one parameter element after an optimizer update (a fault in the stored weights).
``docs/faults.md`` is the reference; the shipped files under ``profiles/`` are
commented starting points to copy.

Every mistake is a one-line ``ConfigError`` naming the file, the dotted key and
the allowed values: a typo that silently disabled a fault would make a faulty run
look healthy.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from faults.corrupt import FIELDS
from faults.ops import FAMILIES, resolve_ops
from faults.schedule import PROBABILITY, Schedule
from tracer import typed_toml
from tracer.errors import ConfigError, ValidationError
from tracer.typed_toml import INLINE, InvalidValue, check, require, toml_field

_BITS = ", ".join(f'"{f}"' for f in FIELDS) + " or a bit index 0..63"
_FACTOR = "a finite non-zero number, or [low, high] with 0 < low <= high"
_VALUE = "a number (nan and inf allowed)"
_FLIPS = "an integer >= 1, or [low, high] with 1 <= low <= high"
Role = Literal["train", "finetune"]
ROLES: tuple[Role, ...] = ("train", "finetune")  # the run roles a rule can name (a run header's ``role``)


class RulePhase(Enum):
    """Where in a step an op a rule may hit runs (`faults.scope`): a rule's ``phases``, a fault event's ``phase``.

    Not the log's `Phase` (what a fingerprint was taken of): the optimizer step is no traced site's phase."""

    FORWARD = "forward"  # inside a hooked module's forward, or with grad enabled
    BACKWARD = "backward"  # while the autograd engine runs
    OPTIMIZER = "optimizer"  # inside an optimizer's step(), outside both: the update (site "")


_PHASES = ", ".join(f'"{p.value}"' for p in RulePhase)


@dataclass(frozen=True)
class Corruption:
    """What happens to each hit element. Its keys sit in the rule's table."""

    kind: Literal["bitflip", "scale", "stuck"]
    bits: str | int | None = toml_field(None, expected=_BITS)  # bitflip: a field or a bit index; "random" if unset
    factor: float | tuple[float, float] | None = toml_field(None, expected=_FACTOR)  # scale: fixed when equal, else
    value: float | None = toml_field(None, expected=_VALUE)  # stuck                     drawn log-uniformly
    flips: int | tuple[int, int] | None = toml_field(  # bitflip: distinct bits flipped per element, drawn in the
        None, expected=_FLIPS
    )  # field `bits` names: a count, or [low, high] drawn uniformly per element; 1 if unset

    def __post_init__(self) -> None:
        kind = self.kind
        for key, owner in (("bits", "bitflip"), ("factor", "scale"), ("value", "stuck"), ("flips", "bitflip")):
            _only_for(kind, key, owner, getattr(self, key))
        if kind == "bitflip":
            bits = "random" if self.bits is None else self.bits
            require(bits in FIELDS or isinstance(bits, int) and 0 <= bits < 64, "bits", bits, _BITS)
            object.__setattr__(self, "bits", bits)
            flips = 1 if self.flips is None else self.flips
            low, high = flips if isinstance(flips, tuple) else (flips, flips)
            require(1 <= low <= high, "flips", flips, _FLIPS)
            check(
                high == 1 or not isinstance(bits, int),
                "flips",
                lambda at: f"{at}flips = {flips} needs bits to name a field to draw them in, not one bit ({bits})",
            )
            object.__setattr__(self, "flips", (low, high))
        elif kind == "scale":
            f = self.factor
            if f is None:
                raise InvalidValue("factor", lambda at: f'{at}factor is missing; kind = "scale" needs {_FACTOR}')
            lo, hi = f if isinstance(f, tuple) else (f, f)
            ok = all(math.isfinite(x) for x in (lo, hi)) and (0 < lo <= hi if isinstance(f, tuple) else f != 0)
            require(ok, "factor", f, _FACTOR)
            object.__setattr__(self, "factor", (lo, hi))
        else:
            check(self.value is not None, "value", lambda at: f'{at}value is missing; kind = "stuck" needs {_VALUE}')


def _only_for(kind: str, key: str, owner: str, value: Any) -> None:
    check(value is None or kind == owner, key, lambda at: f'{at}{key} applies only to kind = "{owner}", not "{kind}"')


@dataclass(frozen=True, kw_only=True)
class FaultRule:
    """One way the node goes wrong: where, how often, how much, what, and when."""

    ops: tuple[str, ...] = toml_field(  # op families or aten op names
        expected=f"a non-empty array of op families ({', '.join(FAMILIES)}, collective), collectives "
        '(all_reduce, reduce_scatter, all_gather, send, recv) or aten op names such as "mm"'
    )
    sites: str | None = toml_field(  # regex a module path must fully match; None: anywhere
        None, expected='a regular expression that module paths must fully match, e.g. ".*_norm"'
    )
    phases: tuple[RulePhase, ...] = toml_field(  # "optimizer": the ops of an optimizer step (the update)
        (RulePhase.FORWARD, RulePhase.BACKWARD), expected=f"a non-empty array of some of {_PHASES}"
    )
    p_call: float = toml_field(1.0, expected=PROBABILITY)  # probability that an eligible call on an armed step is hit
    elements: int | None = toml_field(None, expected="an integer >= 1")  # elements hit per call (1 if neither), or
    fraction: float | None = toml_field(None, expected="a number in (0, 1]")  # the fraction of the result's elements
    stride: int | None = toml_field(  # the hit elements lie this far apart (flat index) from a drawn first one:
        None, expected="an integer >= 1"
    )  # 32, one lane of each warp; None: drawn anywhere
    corruption: Corruption = field(metadata=INLINE)
    schedule: Schedule = field(default_factory=Schedule, metadata=INLINE)
    ranks: tuple[int, ...] | None = toml_field(  # ranks of a multi-rank run the rule applies to; None: every rank
        None, expected="a non-empty array of ranks (integers >= 0)"
    )
    microbatches: tuple[int, ...] | None = toml_field(  # microbatches of a step it fires in; None: every one
        None, expected="a non-empty array of microbatch indices (integers >= 0)"
    )
    attempts: tuple[int, ...] | None = toml_field(  # runs of a step it fires in: 0 the first, 1, 2, ... the
        None, expected="a non-empty array of attempts (integers >= 0; 0 is a step's first run)"
    )  # guard's re-runs
    roles: tuple[Role, ...] | None = toml_field(  # roles of the runs it fires in (pretraining or fine-tuning);
        None, expected='a non-empty array of "train" and/or "finetune"'
    )  # None: every role
    persistent: bool = toml_field(  # a stuck unit: a re-run of the step (the guard's) repeats its faults;
        False, expected="true or false"
    )  # false: transient, each run of a step draws its faults afresh

    def __post_init__(self) -> None:
        _require(self, bool(self.ops), "ops")
        try:
            resolve_ops(self.ops)
        except ConfigError as e:
            problem = str(e)
            raise InvalidValue("ops", lambda at: f"{at}ops: {problem}") from None
        if self.sites is not None:
            try:
                re.compile(self.sites)
            except re.error:
                _require(self, False, "sites")
        _require(self, bool(self.phases), "phases")
        object.__setattr__(self, "phases", tuple(p for p in RulePhase if p in self.phases))
        check(
            self.sites is None or RulePhase.OPTIMIZER not in self.phases,
            "sites",
            lambda at: (
                f"{at}sites names module paths, and an optimizer step's ops run in none: drop {at}sites, "
                'or put the "optimizer" phase in a rule of its own'
            ),
        )
        _require(self, 0 <= self.p_call <= 1, "p_call")
        check(
            self.elements is None or self.fraction is None,
            "fraction",
            lambda at: f"{at}elements and {at}fraction both given; keep one of them",
        )
        _require(self, self.elements is None or self.elements >= 1, "elements")
        _require(self, self.fraction is None or 0 < self.fraction <= 1, "fraction")
        _require(self, self.stride is None or self.stride >= 1, "stride")
        if self.elements is None and self.fraction is None:
            object.__setattr__(self, "elements", 1)
        _require(self, self.roles is None or bool(self.roles), "roles")
        if self.roles is not None:
            object.__setattr__(self, "roles", tuple(r for r in ROLES if r in self.roles))
        for key in ("ranks", "microbatches", "attempts"):
            indices = getattr(self, key)
            if indices is not None:
                _require(self, bool(indices) and min(indices) >= 0, key)
                object.__setattr__(self, key, tuple(sorted(set(indices))))


@dataclass(frozen=True, kw_only=True)
class StateRule:
    """A fault in the training state, not in an op: one bit of one element of one parameter flipped right after
    the optimizer update of ``step`` (before the Tracer fingerprints the parameters), as a flip in the memory that
    holds the weights between steps would. A ``[[state]]`` table of a profile; `faults.state_faults` applies it."""

    parameter: str = toml_field(  # the name `model.named_parameters()` gives, wrappers' prefixes left out
        expected='a parameter name as the model writes it, e.g. "layers.0.attention.wq.weight"'
    )
    step: int = toml_field(expected="an integer >= 0")  # the optimizer step after whose update the bit flips
    element: int | None = toml_field(  # flat index into the parameter (a DTensor: this rank's shard); None: drawn
        None, expected="an integer >= 0"
    )  # from the profile seed and the run's fault seed
    bits: str | int = toml_field(0, expected=_BITS)  # 0: the last mantissa bit, one ulp; a field: one bit drawn in it
    ranks: tuple[int, ...] | None = toml_field(None, expected="a non-empty array of ranks (integers >= 0)")
    roles: tuple[Role, ...] | None = toml_field(None, expected='a non-empty array of "train" and/or "finetune"')

    def __post_init__(self) -> None:
        _require(self, bool(self.parameter), "parameter")
        _require(self, self.step >= 0, "step")
        _require(self, self.element is None or self.element >= 0, "element")
        _require(self, self.bits in FIELDS or isinstance(self.bits, int) and 0 <= self.bits < 64, "bits")
        _require(self, self.ranks is None or bool(self.ranks) and min(self.ranks) >= 0, "ranks")
        _require(self, self.roles is None or bool(self.roles), "roles")


def _require(rule: Any, ok: bool, key: str) -> None:
    require(ok, key, getattr(rule, key), typed_toml.expected(type(rule), key))


@dataclass(frozen=True)
class _ProfileFile:
    """The keys of a profile file; `load_profile` adds its name, path and hash."""

    description: str = ""
    seed: int = toml_field(0, expected="an integer >= 0")
    fault: tuple[FaultRule, ...] = ()
    state: tuple[StateRule, ...] = ()

    def __post_init__(self) -> None:
        _require(self, self.seed >= 0, "seed")


@dataclass(frozen=True)
class FaultProfile:
    name: str
    description: str
    seed: int
    faults: tuple[FaultRule, ...]
    path: str = field(compare=False)  # where it was read from: a file, or a run header
    data: dict[str, Any] = field(repr=False)  # the parsed TOML, which a run header records whole
    sha256: str  # of `data`'s canonical JSON: the run header says exactly which profile ran
    states: tuple[StateRule, ...] = ()  # the ``[[state]]`` rules: bits of parameters flipped after an update

    def header(self, fault_seed: int) -> dict[str, Any]:
        """What a run header's ``extra["fault_profile"]`` records: enough to run the profile again
        (`profile_from_header`), wherever its file went."""
        return {"name": self.name, "sha256": self.sha256, "seed": fault_seed, "profile": self.data}


def shipped_profiles() -> dict[str, Path]:
    """Name -> path of every profile that ships with the package."""
    return typed_toml.shipped("faults", "profiles")


def load_profile(spec: str | Path) -> FaultProfile:
    """Load a shipped profile by name, or a TOML file by path, and validate all of it."""
    path = typed_toml.resolve(spec, shipped_profiles(), "fault profile")
    return _profile(path.stem, typed_toml.read(path), str(path))


def profile_from_header(recorded: Mapping[str, Any]) -> FaultProfile:
    """The profile a run header's ``extra["fault_profile"]`` recorded, rebuilt and validated, so that a
    run recorded with a profile of the user's own can be emulated again without its file."""
    name, data = recorded.get("name"), recorded.get("profile")
    source = f"fault profile {name!r} in the run header"
    if not isinstance(name, str) or not isinstance(data, Mapping):
        raise ValidationError(
            f"{source}: fault_profile.profile is missing (recorded before run headers held "
            "the whole profile); pass the profile's file instead"
        )
    profile = _profile(name, data, source)
    if recorded.get("sha256") != profile.sha256:
        raise ValidationError(
            f"{source}: fault_profile.sha256 = {str(recorded.get('sha256'))[:12]}... does not "
            f"match the recorded profile (sha256 {profile.sha256[:12]}...); the header was "
            "altered: pass the profile's file instead"
        )
    return profile


def _profile(name: str, data: Mapping[str, Any], source: str) -> FaultProfile:
    read = typed_toml.from_dict(_ProfileFile, data, source)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return FaultProfile(
        name,
        read.description,
        read.seed,
        read.fault,
        source,
        dict(data),
        hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        read.state,
    )
