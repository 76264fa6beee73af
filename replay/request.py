"""What one replay is asked to do: the suspect that plays the unhealthy node and the typed `ReplayRequest`.

    golden = LogReader(rank_dir(path, 0)).header
    suspect = suspect_from_run(run, golden, path)     # or suspect_from_profile("healthy-node", fault_seed=0)
    request = ReplayRequest(path, out, parse_steps("10:20"), suspect, mode="lockstep")
    summary = Replayer(request).run()                 # one rank; `sdc replay` runs it as a job (jobs/replay.py)

The suspect is built once per job and carries its parsed `FaultProfile`; the request is
the same on every rank. `to_json` / `from_json` exist only for the ranks a job launches:
the profile travels in its run-header form (`FaultProfile.header`, `faults.profile_from_header`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from faults import FaultProfile, load_profile, profile_from_header
from tracer.errors import ConfigError, SdcError, ValidationError
from tracer.log import LogReader, rank_dir
from tracer.log.records import RunHeader
from tracer.pairing import check_pair

Mode = Literal["param-sync", "lockstep"]
MODES: tuple[Mode, ...] = ("param-sync", "lockstep")
GoldenFrom = Literal["auto", "blobs", "reexec"]


@dataclass(frozen=True)
class Suspect:
    """What plays the suspect node: this machine, optionally with an emulated fault profile."""

    label: str
    profile: FaultProfile | None
    fault_seed: int
    source: dict[str, Any]  # what the replay log's header says of it
    run: Path | None = None  # the suspect's recorded run, when it plays one: an input a replay never writes over

    def to_json(self) -> dict[str, Any]:
        """Plain data for a launched rank; the profile in its run-header form."""
        return {
            "label": self.label,
            "profile": self.profile.header(self.fault_seed) if self.profile else None,
            "fault_seed": self.fault_seed,
            "source": self.source,
            "run": str(self.run) if self.run is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Suspect:
        profile = profile_from_header(data["profile"]) if data["profile"] is not None else None
        run = Path(data["run"]) if data["run"] is not None else None
        return cls(data["label"], profile, data["fault_seed"], data["source"], run)


def suspect_from_profile(spec: str, fault_seed: int = 0) -> Suspect:
    """An emulated node: the profile ``spec`` (a shipped name or a TOML path), loaded here, once per job."""
    profile = load_profile(spec)
    return Suspect(f"emulated:{profile.name}", profile, fault_seed, {"kind": "profile", **profile.header(fault_seed)})


def suspect_from_run(path: str | Path, golden: RunHeader, golden_path: Path) -> Suspect:
    """The node that recorded ``path``; the fault profile it ran, if any, is emulated again from the run's
    header, which holds the whole profile (profiles are data: nothing is imported)."""
    path = Path(path)
    header = LogReader(rank_dir(path, 0)).header
    check_pair(golden, header, str(golden_path), str(path))
    source = {"kind": "run", "path": str(path), "run_id": header.run_id, "node_label": header.node_label}
    recorded = header.extra.get("fault_profile")
    if not recorded:
        return Suspect(header.node_label, None, 0, source, path)
    if not isinstance(recorded, dict):
        raise ValidationError(f"{path}: its header's fault_profile is not a table; the run header is damaged")
    try:
        profile = profile_from_header(recorded)
    except SdcError as exc:
        raise ValidationError(
            f"{path}: {exc}; or replay with --fault-profile FILE --fault-seed "
            f"{recorded.get('seed', 0)} instead of --suspect"
        ) from None
    seed = recorded.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValidationError(f"{path}: its header's fault_profile.seed = {seed!r} is not an integer")
    return Suspect(header.node_label, profile, seed, {**source, "fault_profile": recorded}, path)


@dataclass(frozen=True)
class ReplayRequest:
    """One replay, as `sdc replay` and `sdc study` ask for it; the same on every rank."""

    golden: Path
    out: Path
    steps: range  # stop exclusive
    suspect: Suspect
    mode: Mode = "lockstep"
    golden_from: GoldenFrom = "auto"
    workload: str | None = None  # the factory that rebuilds the golden run (None: the reference workload)
    overwrite: bool = False
    progress: bool = True
    clip: bool = False  # cut ``steps`` at the run's last step instead of refusing
    run_id: str | None = None  # the replay log's run id (None: a random one; a study derives it, for same bytes)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode!r}: choose one of {', '.join(MODES)}")

    def to_json(self) -> dict[str, Any]:
        """Plain data for the launcher, which hands the request to every rank's process."""
        return {
            "golden": str(self.golden),
            "out": str(self.out),
            "steps": [self.steps.start, self.steps.stop],
            "suspect": self.suspect.to_json(),
            "mode": self.mode,
            "golden_from": self.golden_from,
            "workload": self.workload,
            "overwrite": self.overwrite,
            "progress": self.progress,
            "clip": self.clip,
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayRequest:
        return cls(
            **{
                **data,
                "golden": Path(data["golden"]),
                "out": Path(data["out"]),
                "steps": range(*data["steps"]),
                "suspect": Suspect.from_json(data["suspect"]),
            }
        )


def parse_steps(text: str) -> range:
    """``"10:20"`` (stop exclusive) or ``"12"``."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            steps = range(int(a), int(b))
        else:
            steps = range(int(text), int(text) + 1)
    except ValueError:
        raise ConfigError(f"--steps {text!r}: expected START:STOP (stop exclusive) or one step, e.g. 10:20") from None
    if not steps or steps.start < 0:
        raise ConfigError(f"--steps {text!r}: the range is empty; STOP must be greater than START >= 0")
    return steps
