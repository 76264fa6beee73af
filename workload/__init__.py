"""workload: the workload protocol (how to rebuild a training run step by step, for record and replay) and the
reference LLaMA-style workload (`workload.reference:build`).

    from workload import Workload, run_step

    class MyWorkload(Workload):
        def microbatches(self, step): ...
        def loss(self, step, batch): ...

    def build(config, device) -> Workload: ...   # named as my_pkg.train:build on the command line

The training frameworks' workloads import their framework, so they stay in their modules:
`workload.hf.TrainerWorkload` and `workload.lightning.LightningWorkload`. Importing `workload` imports none of
the modules behind these names; each is imported when first used (`tracer.exports`).
"""

from typing import TYPE_CHECKING

from tracer.exports import lazy_exports

__all__ = [
    "RunSettings",
    "StepObserver",
    "Workload",
    "build_workload",
    "forward_backward",
    "load_workload_config",
    "run_step",
]

if TYPE_CHECKING:
    from workload.protocol import (
        RunSettings,
        StepObserver,
        Workload,
        build_workload,
        forward_backward,
        load_workload_config,
        run_step,
    )
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "workload.protocol": (
                "RunSettings",
                "StepObserver",
                "Workload",
                "build_workload",
                "forward_backward",
                "load_workload_config",
                "run_step",
            ),
        },
    )
