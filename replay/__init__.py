"""replay: rebuild a recorded step and run it again with golden state injected (param-sync or lockstep), writing
a replay log (docs/replay.md; docs/architecture.md). `sdc replay` runs it as a job; from Python, on one rank:

    from replay import Replayer, ReplayRequest, parse_steps, suspect_from_profile

    suspect = suspect_from_profile("rare-huge", fault_seed=3)
    summary = Replayer(ReplayRequest(golden, out, parse_steps("10:20"), suspect, mode="lockstep")).run()

Importing `replay` imports none of the modules behind these names; each is imported when first used
(`tracer.exports`).
"""

from typing import TYPE_CHECKING

from tracer.exports import lazy_exports

__all__ = [
    "MODES",
    "ReplayRequest",
    "ReplaySummary",
    "Replayer",
    "StepResult",
    "Suspect",
    "parse_steps",
    "suspect_from_profile",
    "suspect_from_run",
]

if TYPE_CHECKING:
    from replay.replayer import Replayer
    from replay.request import MODES, ReplayRequest, Suspect, parse_steps, suspect_from_profile, suspect_from_run
    from replay.results import ReplaySummary, StepResult
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "replay.replayer": ("Replayer",),
            "replay.request": (
                "MODES",
                "ReplayRequest",
                "Suspect",
                "parse_steps",
                "suspect_from_profile",
                "suspect_from_run",
            ),
            "replay.results": ("ReplaySummary", "StepResult"),
        },
    )
