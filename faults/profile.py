"""Fault profiles: TOML files that describe an emulated unhealthy node.

    profile = load_profile("bursty-mismatch")          # a shipped profile, or a path
    print(profile.faults[0].corruption.kind)

A profile is a description, a seed and a list of ``[[fault]]`` rules; each rule
says which ops (and module paths) it hits, in which phases, how often, how many
elements, what corruption, and on which steps. ``docs/faults.md`` is the reference;
the shipped files under ``profiles/`` are commented starting points to copy.

Every mistake is a one-line ``ConfigError`` naming the file, the dotted key and
the allowed values: a typo that silently disabled a fault would make a faulty run
look healthy.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from faults.corrupt import FIELDS
from faults.ops import FAMILIES, resolve_ops
from faults.schedule import Schedule
from tracer.errors import ConfigError
from tracer.log.records import Phase

PHASES = ("forward", "backward")
KINDS = ("bitflip", "scale", "stuck")


@dataclass(frozen=True)
class Corruption:
    """What happens to each hit element."""

    kind: Literal["bitflip", "scale", "stuck"]
    bits: str | int = "random"  # bitflip: "sign" | "exponent" | "mantissa" | "random" | a bit index
    factor: tuple[float, float] = (1.0, 1.0)  # scale: fixed when equal, else drawn log-uniformly
    value: float = 0.0  # stuck


@dataclass(frozen=True)
class FaultRule:
    """One way the node goes wrong: where, how often, how much, what, and when."""

    ops: tuple[str, ...]  # op families or aten op names
    corruption: Corruption
    sites: str | None = None  # regex a module path must fully match; None: anywhere
    phases: tuple[Phase, ...] = (Phase.FORWARD, Phase.BACKWARD)
    p_call: float = 1.0  # probability that an eligible call on an armed step is hit
    elements: int | None = 1  # elements hit per call, or
    fraction: float | None = None  # the fraction of the result's elements hit
    schedule: Schedule = field(default_factory=Schedule)
    ranks: tuple[int, ...] | None = None  # ranks of a multi-rank run the rule applies to; None: every rank


@dataclass(frozen=True)
class FaultProfile:
    name: str
    description: str
    seed: int
    faults: tuple[FaultRule, ...]
    path: str
    sha256: str  # of the file's bytes: the run header says exactly which profile ran

    def header(self, fault_seed: int) -> dict[str, Any]:
        """What a run header's ``extra["fault_profile"]`` records."""
        return {"name": self.name, "sha256": self.sha256, "seed": fault_seed}


_TOP_KEYS = {
    "description": "a string",
    "seed": "an integer >= 0",
    "fault": "an array of tables, written as [[fault]] sections",
}
_RULE_KEYS = {
    "ops": f"a non-empty array of op families ({', '.join(FAMILIES)}, collective), collectives "
    "(all_reduce, reduce_scatter, all_gather) or aten op names such as \"mm\"",
    "sites": 'a regular expression that module paths must fully match, e.g. ".*_norm"',
    "phases": 'a non-empty array of "forward" and/or "backward"',
    "p_call": "a number in [0, 1]",
    "elements": "an integer >= 1",
    "fraction": "a number in (0, 1]",
    "kind": ", ".join(f'"{k}"' for k in KINDS),
    "bits": ", ".join(f'"{f}"' for f in FIELDS) + " or a bit index 0..63",
    "factor": "a finite non-zero number, or [low, high] with 0 < low <= high",
    "value": "a number (nan and inf allowed)",
    "p_enter": "a number in [0, 1]",
    "p_exit": "a number in [0, 1]",
    "start": "an integer >= 0",
    "stop": "an integer greater than start",
    "steps": "an array of integers >= 0",
    "ranks": "a non-empty array of ranks (integers >= 0)",
}
_KIND_KEYS = {"bits": "bitflip", "factor": "scale", "value": "stuck"}


def shipped_profiles() -> dict[str, Path]:
    """Name -> path of every profile that ships with the package."""
    folder = resources.files("faults") / "profiles"
    return {
        p.name.removesuffix(".toml"): Path(str(p))
        for p in sorted(folder.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".toml")
    }


def load_profile(spec: str | Path) -> FaultProfile:
    """Load a shipped profile by name, or a TOML file by path, and validate all of it."""
    shipped = shipped_profiles()
    path = shipped[spec] if isinstance(spec, str) and spec in shipped else Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"fault profile {str(spec)!r} not found: no such file, and not a shipped profile; "
            f"pass a path to a TOML file or one of: {', '.join(shipped)}"
        )
    data = path.read_bytes()
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a valid UTF-8 TOML file ({e}); fix that line") from None
    return _Reader(str(path)).profile(raw, path.stem, hashlib.sha256(data).hexdigest())


class _Reader:
    """Validates one parsed file; every error names ``source`` and the dotted key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, value: Any, allowed: str) -> ConfigError:
        return ConfigError(f"{self.source}: {key} = {value!r} is not allowed; expected {allowed}")

    def check_keys(self, table: dict[str, Any], allowed: dict[str, str], where: str) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, list(allowed), n=1)
                hint = f" (did you mean {where}{close[0]}?)" if close else ""
                raise ConfigError(
                    f"{self.source}: unknown key {where}{key}{hint}; allowed keys: {', '.join(allowed)}"
                )

    def profile(self, raw: dict[str, Any], name: str, sha256: str) -> FaultProfile:
        self.check_keys(raw, _TOP_KEYS, "")
        description = raw.get("description", "")
        if not isinstance(description, str):
            raise self.error("description", description, _TOP_KEYS["description"])
        seed = self.integer(raw, "seed", "seed", 0, 0)
        rules = raw.get("fault", [])
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise self.error("fault", rules, _TOP_KEYS["fault"])
        faults = tuple(self.rule(r, f"fault[{i}].") for i, r in enumerate(rules))
        return FaultProfile(name, description, seed, faults, self.source, sha256)

    def rule(self, t: dict[str, Any], at: str) -> FaultRule:
        self.check_keys(t, _RULE_KEYS, at)
        ops = t.get("ops")
        if not isinstance(ops, list) or not ops or not all(isinstance(o, str) for o in ops):
            raise self.error(at + "ops", ops, _RULE_KEYS["ops"])
        try:
            resolve_ops(ops)
        except ConfigError as e:
            raise ConfigError(f"{self.source}: {at}ops: {e}") from None
        sites = t.get("sites")
        if sites is not None:
            try:
                re.compile(sites)
            except (re.error, TypeError):
                raise self.error(at + "sites", sites, _RULE_KEYS["sites"]) from None
        phases = t.get("phases", list(PHASES))
        if not isinstance(phases, list) or not phases or not set(phases) <= set(PHASES):
            raise self.error(at + "phases", phases, _RULE_KEYS["phases"])
        if "elements" in t and "fraction" in t:
            raise ConfigError(f"{self.source}: {at}elements and {at}fraction both given; keep one of them")
        fraction = self.number(t, "fraction", at, None, lambda x: 0 < x <= 1)
        ranks = t.get("ranks")
        if ranks is not None and (not isinstance(ranks, list) or not ranks or not all(_is_int(r) and r >= 0 for r in ranks)):
            raise self.error(at + "ranks", ranks, _RULE_KEYS["ranks"])
        return FaultRule(
            ops=tuple(ops),
            corruption=self.corruption(t, at),
            sites=sites,
            phases=tuple(Phase[p.upper()] for p in PHASES if p in phases),
            p_call=self.number(t, "p_call", at, 1.0, lambda x: 0 <= x <= 1),
            elements=None if fraction is not None else self.integer(t, "elements", at + "elements", 1, 1),
            fraction=fraction,
            schedule=self.schedule(t, at),
            ranks=tuple(sorted(set(ranks))) if ranks is not None else None,
        )

    def corruption(self, t: dict[str, Any], at: str) -> Corruption:
        kind = t.get("kind")
        if kind not in KINDS:
            raise self.error(at + "kind", kind, _RULE_KEYS["kind"])
        for key, owner in _KIND_KEYS.items():
            if key in t and owner != kind:
                raise ConfigError(f'{self.source}: {at}{key} applies only to kind = "{owner}", not "{kind}"')
        if kind == "bitflip":
            bits = t.get("bits", "random")
            ok_index = isinstance(bits, int) and not isinstance(bits, bool) and 0 <= bits < 64
            if not (ok_index or bits in FIELDS):
                raise self.error(at + "bits", bits, _RULE_KEYS["bits"])
            return Corruption("bitflip", bits=bits)
        if kind == "scale":
            return Corruption("scale", factor=self.factor(t, at))
        value = t.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(at + "value", value, _RULE_KEYS["value"])
        return Corruption("stuck", value=float(value))

    def factor(self, t: dict[str, Any], at: str) -> tuple[float, float]:
        f = t.get("factor")
        if _is_number(f) and math.isfinite(f) and f != 0:
            return (float(f), float(f))
        if isinstance(f, list) and len(f) == 2 and all(_is_number(x) and math.isfinite(x) for x in f) \
                and 0 < f[0] <= f[1]:
            return (float(f[0]), float(f[1]))
        raise self.error(at + "factor", f, _RULE_KEYS["factor"])

    def schedule(self, t: dict[str, Any], at: str) -> Schedule:
        start = self.integer(t, "start", at + "start", 0, 0)
        stop = t.get("stop")
        if stop is not None and (not _is_int(stop) or stop <= start):
            raise self.error(at + "stop", stop, f"an integer greater than start = {start}")
        steps = t.get("steps", [])
        if not isinstance(steps, list) or not all(_is_int(s) and s >= 0 for s in steps):
            raise self.error(at + "steps", steps, _RULE_KEYS["steps"])
        return Schedule(
            p_enter=self.number(t, "p_enter", at, 1.0, lambda x: 0 <= x <= 1),
            p_exit=self.number(t, "p_exit", at, 0.0, lambda x: 0 <= x <= 1),
            start=start,
            stop=stop,
            steps=tuple(sorted(set(steps))),
        )

    def number(self, t: dict[str, Any], key: str, at: str, default: float | None, ok: Any) -> float | None:
        if key not in t:
            return default
        v = t[key]
        if not _is_number(v) or not ok(v):
            raise self.error(at + key, v, _RULE_KEYS[key])
        return float(v)

    def integer(self, t: dict[str, Any], key: str, dotted: str, default: int, minimum: int) -> int:
        v = t.get(key, default)
        if not _is_int(v) or v < minimum:
            raise self.error(dotted, v, f"an integer >= {minimum}")
        return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
