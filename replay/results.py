"""What a replay returns on one rank: a `ReplaySummary` with a `StepResult` per replayed step.

    summary = Replayer(request).run()
    worst = max(r.worst_frequency for r in summary.steps)     # lockstep; param-sync: r.noise

The replay log holds the same figures as events; these are for printing and for studies.
`to_json` / `from_json` carry a launched rank's summary back to its job (jobs/replay.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.request import Mode


@dataclass
class StepResult:
    step: int
    golden_loss: float
    suspect_loss: float
    worst_frequency: float = 0.0  # lockstep: max over sites
    noise: float | None = None  # param-sync: total noise-to-signal
    faults: int = 0
    wall_s: float = 0.0  # golden re-execution and suspect step together
    executions: int = 0  # runs of the step: golden re-executions and suspect steps (replay/replayer.py)


@dataclass
class ReplaySummary:
    out: Path
    mode: Mode
    steps: list[StepResult] = field(default_factory=list)
    checked: int = 0  # golden fingerprints verified
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "out": str(self.out)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplaySummary:
        steps = [StepResult(**r) for r in data["steps"]]
        return cls(Path(data["out"]), data["mode"], steps, data["checked"], data["wall_s"])
