"""tracer: everything that runs on the training node (docs/architecture.md); its public names are below.

    from tracer import RunInfo, Tracer, configure_determinism

    configure_determinism(seed=0, threads=1)
    with Tracer(model, optimizer, out="runs/node-7", run=RunInfo("node-7")) as tr:
        ...

docs/api.md documents each name. Importing `tracer` imports none of the modules behind them (not even torch):
each is imported when its first name is used (`tracer.exports`). Everything not listed in ``__all__`` may change;
the training-framework callbacks live in `tracer.integrations.hf` and `tracer.integrations.lightning`.
"""

from typing import TYPE_CHECKING

from tracer.exports import lazy_exports

__all__ = [
    "AbftFlags",
    "Alarm",
    "CapturePolicy",
    "Detector",
    "Evidence",
    "GradNormSpike",
    "Guard",
    "GuardStop",
    "Layout",
    "LossSpike",
    "NonFinite",
    "Pipeline",
    "RecordedTwin",
    "ReplicaAgreement",
    "RestoredCheckpoint",
    "RunInfo",
    "SdcError",
    "TraceOptions",
    "TraceWarning",
    "Tracer",
    "TwinMismatch",
    "UpdateRmsSpike",
    "compare_runs",
    "configure_determinism",
    "default_guard",
    "list_step_checkpoints",
    "load_sharded_checkpoint",
    "restore_step_checkpoint",
    "save_sharded_checkpoint",
    "save_step_checkpoint",
    "summarize_run",
]

if TYPE_CHECKING:
    from tracer.checkpoint.interface import RestoredCheckpoint
    from tracer.checkpoint.sharded import load_sharded_checkpoint, save_sharded_checkpoint
    from tracer.checkpoint.step import list_step_checkpoints, restore_step_checkpoint, save_step_checkpoint
    from tracer.compare import compare_runs
    from tracer.determinism import configure_determinism
    from tracer.errors import GuardStop, SdcError, TraceWarning
    from tracer.guard import (
        AbftFlags,
        Alarm,
        Detector,
        Evidence,
        GradNormSpike,
        Guard,
        LossSpike,
        NonFinite,
        RecordedTwin,
        ReplicaAgreement,
        TwinMismatch,
        UpdateRmsSpike,
        default_guard,
    )
    from tracer.options import CapturePolicy, RunInfo, TraceOptions
    from tracer.parallel import Layout, Pipeline
    from tracer.summary import summarize_run
    from tracer.tracing import Tracer
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "tracer.tracing": ("Tracer",),
            "tracer.options": ("CapturePolicy", "RunInfo", "TraceOptions"),
            "tracer.parallel": ("Layout", "Pipeline"),
            "tracer.determinism": ("configure_determinism",),
            "tracer.guard": (
                "AbftFlags",
                "Alarm",
                "Detector",
                "Evidence",
                "GradNormSpike",
                "Guard",
                "LossSpike",
                "NonFinite",
                "RecordedTwin",
                "ReplicaAgreement",
                "TwinMismatch",
                "UpdateRmsSpike",
                "default_guard",
            ),
            # Checkpoints: the modules that define these names (keep them together: they may move).
            "tracer.checkpoint.interface": ("RestoredCheckpoint",),
            "tracer.checkpoint.sharded": ("load_sharded_checkpoint", "save_sharded_checkpoint"),
            "tracer.checkpoint.step": ("list_step_checkpoints", "restore_step_checkpoint", "save_step_checkpoint"),
            "tracer.compare": ("compare_runs",),
            "tracer.summary": ("summarize_run",),
            "tracer.errors": ("GuardStop", "SdcError", "TraceWarning"),
        },
    )
