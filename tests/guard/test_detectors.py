"""Detectors, the guard's decision rule and its configuration errors, on hand-made evidence."""

from __future__ import annotations

import math

import pytest

from tracer.errors import ConfigError
from tracer.guard import (
    AbftFlags,
    Evidence,
    GradNormSpike,
    Guard,
    History,
    LossSpike,
    NonFinite,
    TwinMismatch,
    UpdateRmsSpike,
    classify,
)
from tracer.guard.guard import verdict


def evidence(
    loss: float | None = 2.0,
    grad_norm: float = 1.0,
    *,
    nonfinite: int = 0,
    abft_flags: int = 0,
    fingerprint: int = 7,
    update_rms: float | None = None,
    past: History = History(),  # noqa: B008 - frozen
    step: int = 9,
) -> Evidence:
    return Evidence(step, 0, loss, grad_norm, nonfinite, abft_flags, fingerprint, update_rms, past)


def history(n: int, loss: float = 2.0, norm: float = 1.0, rms: float = 1e-3) -> History:
    """n accepted steps with a little noise around the given values."""
    h = History()
    for i in range(n):
        wiggle = 1 + 0.01 * ((i % 5) - 2)
        h = h.after(evidence(loss * wiggle, norm * wiggle, update_rms=rms * wiggle), keep=32)
    return h


def test_non_finite_fires_on_a_nan_loss_or_nan_inf_gradients_only() -> None:
    d = NonFinite()
    assert d.check(evidence()) is None
    alarm = d.check(evidence(loss=math.inf))
    assert alarm is not None and alarm.detector == "non_finite" and alarm.measured == math.inf
    alarm = d.check(evidence(nonfinite=3))
    assert alarm is not None and (alarm.measured, alarm.threshold) == (3.0, 0.0) and "3 NaN/Inf" in alarm.detail


def test_loss_spike_is_a_robust_z_score_against_accepted_history() -> None:
    d = LossSpike(window=16, z=8.0, min_history=4)
    assert d.check(evidence(loss=50.0, past=history(3))) is None  # too little history: quiet
    past = history(16)
    assert d.check(evidence(loss=2.02, past=past)) is None
    assert d.check(evidence(loss=1.0, past=past)) is None  # a drop is no spike
    alarm = d.check(evidence(loss=3.0, past=past))
    assert alarm is not None and alarm.measured > 8.0 and alarm.threshold == 8.0 and "median 2" in alarm.detail
    # The floor keeps a perfectly flat curve from turning a tiny rise into a spike.
    flat = History(loss=(2.0,) * 16)
    assert d.check(evidence(loss=2.001, past=flat)) is None
    assert d.check(evidence(loss=2.5, past=flat)) is not None


def test_ratio_detectors_compare_with_the_median_of_their_window() -> None:
    past = history(32)
    norm, rms = GradNormSpike(factor=4.0), UpdateRmsSpike(factor=3.0)
    assert norm.check(evidence(grad_norm=3.9, past=past)) is None
    alarm = norm.check(evidence(grad_norm=5.0, past=past))
    assert alarm is not None and alarm.measured == pytest.approx(5.0) and alarm.detector == "grad_norm_spike"
    assert norm.check(evidence(grad_norm=math.nan, past=past)) is not None
    assert rms.check(evidence(update_rms=None, past=past)) is None
    assert rms.check(evidence(update_rms=2.9e-3, past=past)) is None
    assert rms.check(evidence(update_rms=4e-3, past=past)) is not None
    # Only the last `window` steps count.
    old_then_new = History(grad_norm=(100.0,) * 20 + (1.0,) * 8)
    assert GradNormSpike(window=8, min_history=8).check(evidence(grad_norm=6.0, past=old_then_new)) is not None


def test_history_keeps_the_newest_finite_values() -> None:
    h = History()
    for x in [1.0, math.nan, 2.0, 3.0, math.inf, 4.0]:
        h = h.after(evidence(loss=x, grad_norm=x), keep=3)
    assert h.loss == h.grad_norm == (2.0, 3.0, 4.0)
    assert h.update_rms == ()
    assert History().after(evidence(), keep=0) == History()


def test_abft_flags_and_twin_mismatch() -> None:
    assert AbftFlags().check(evidence()) is None
    assert AbftFlags(min_flags=2).check(evidence(abft_flags=1)) is None
    assert AbftFlags().check(evidence(abft_flags=4)).measured == 4.0

    class Twin:
        def fingerprint(self, step: int) -> int | None:
            return {1: 7, 2: 8}.get(step)

    d = TwinMismatch(Twin())
    assert d.check(evidence(step=1, fingerprint=7)) is None
    assert d.check(evidence(step=3, fingerprint=7)) is None  # the twin has no step 3 yet: abstain
    alarm = d.check(evidence(step=2, fingerprint=7))
    assert alarm is not None and "0000000000000008" in alarm.detail


def test_classify_needs_two_runs_that_agree() -> None:
    assert classify([5], 3) is None  # the first run alone decides nothing
    assert classify([5, 5], 3) == "deterministic"  # one identical re-run settles it
    assert classify([5, 6], 3) is None
    assert classify([5, 6, 6], 3) == "transient"
    assert classify([5, 6, 5], 3) == "deterministic"  # the re-run was the odd one out
    assert classify([5, 6, 7], 3) == "unresolved"
    assert classify([5, 6], 2) == "unresolved"
    assert classify([5, 6, 7], 4) is None and classify([5, 6, 7, 6], 4) == "transient"


def test_verdicts() -> None:
    assert verdict("transient", "stop", 2) == verdict("transient", "skip", 2)
    assert (v := verdict("transient", "stop", 2)).action == "continue" and v.accepted == 2
    assert verdict("deterministic", "continue", 1).accepted == 1
    for outcome in ("deterministic", "unresolved", "unclassified"):
        v = verdict(outcome, "skip", 1)
        assert (v.action, v.accepted) == ("skip", None)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Guard(detectors=()), "at least one detector"),
        (lambda: Guard(detectors=(NonFinite(), NonFinite())), "named alike"),
        (lambda: Guard(detectors=("nan",)), "'nan' is no detector"),
        (lambda: Guard(on_deterministic="retry"), "expected one of continue, skip, stop"),
        (lambda: Guard(max_runs=1), "must be >= 2"),
        (lambda: LossSpike(window=4, min_history=8), "1 <= min_history <= window"),
        (lambda: LossSpike(z=-1.0), "z=-1.0"),
        (lambda: GradNormSpike(factor=0.5), "must be a finite number > 1.0"),
        (lambda: AbftFlags(min_flags=0), "must be >= 1"),
    ],
)
def test_configuration_mistakes_are_config_errors(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_guard_description_and_window() -> None:
    g = Guard(detectors=(NonFinite(), LossSpike(window=10), GradNormSpike(window=20)), on_deterministic="stop")
    assert g.keep == 20 and not g.wants_update_rms
    assert g.describe() == {
        "detectors": [
            {"name": "non_finite"},
            {
                "name": "loss_spike",
                "window": 10,
                "z": LossSpike.z,
                "floor": LossSpike.floor,
                "min_history": LossSpike.min_history,
            },
            {
                "name": "grad_norm_spike",
                "window": 20,
                "factor": GradNormSpike.factor,
                "min_history": GradNormSpike.min_history,
            },
        ],
        "on_deterministic": "stop",
        "max_runs": 3,
    }


def test_the_guard_says_once_at_the_start_which_detectors_are_quiet_for_their_first_steps() -> None:
    import warnings

    import torch
    from torch import nn

    from tracer.errors import TraceWarning
    from tracer.guard.runtime import StepGuard

    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.warns(TraceWarning, match=r"loss_spike \(the first 8 steps\), grad_norm_spike \(the first 8 steps\)"):
        StepGuard(Guard(), optimizer)  # the defaults
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StepGuard(Guard(detectors=(NonFinite(),)), optimizer)  # nothing to warm up
