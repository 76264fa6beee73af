"""Act while the job runs: detectors look at each step before the optimizer consumes it, and a guard
re-runs a flagged step to tell a transient fault from a deterministic one (docs/guard.md).

    from tracer.guard import Guard, NonFinite, LossSpike, GradNormSpike
    with Tracer(model, optimizer, out="runs/a", run=run, guard=Guard(on_deterministic="stop")) as tr: ...
"""

from tracer.guard.detectors import (
    AbftFlags,
    Alarm,
    Detector,
    GradNormSpike,
    LossSpike,
    NonFinite,
    TwinMismatch,
    UpdateRmsSpike,
)
from tracer.guard.evidence import Evidence, History, step_fingerprint
from tracer.guard.guard import Guard, Outcome, Policy, Verdict, classify, default_guard
from tracer.guard.replicas import Disagreement, ReplicaAgreement
from tracer.guard.twin import RecordedTwin

__all__ = [
    "AbftFlags",
    "Alarm",
    "Detector",
    "Disagreement",
    "Evidence",
    "GradNormSpike",
    "Guard",
    "History",
    "LossSpike",
    "NonFinite",
    "Outcome",
    "Policy",
    "RecordedTwin",
    "ReplicaAgreement",
    "TwinMismatch",
    "UpdateRmsSpike",
    "Verdict",
    "classify",
    "default_guard",
    "step_fingerprint",
]
