"""Checkpoints are checked against the parameter fingerprints the log recorded (issue 31, case 4).

A checkpoint of step k holds the parameters after step k - 1's update, which the log recorded as PARAM records
of step k - 1. A tensor changed together with its manifest entry passes the manifest's own check; the log's
catches it, in every reader (load, replay, drift, resume), as one line naming file, tensor and step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.tracer.checkpoint_tamper import tamper_both
from tracer.checkpoint import list_checkpoints, load_checkpoint
from tracer.checkpoint.logged_parameters import logged_parameters
from tracer.errors import CheckpointChangedError
from tracer.fingerprint import fingerprint
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord

CHANGED = r"rank-00000.*'model/[^']+' of the checkpoint of step 2 .*the log recorded at step 1 .*changed after it was"


def param_records(run: Path, step: int, rank: int = 0) -> dict[str, int]:
    return {
        r.name: r.fingerprint
        for r in LogReader(rank_dir(run, rank)).records()
        if isinstance(r, TensorRecord) and r.phase == Phase.PARAM and r.step == step
    }


def test_every_checkpoint_of_a_healthy_run_matches_what_the_log_recorded_before_its_step(run_factory) -> None:
    run = run_factory("golden")
    steps = list_checkpoints(run)
    assert steps == [0, 2, 4]
    assert logged_parameters(run, 0, 0) is None  # nothing was recorded before step 0: nothing to compare
    for step in steps[1:]:
        logged = logged_parameters(run, 0, step)
        assert logged is not None and logged.log_step == step - 1
        ckpt = load_checkpoint(run, step)  # the check passes on a healthy run
        assert logged.fingerprints and set(logged.fingerprints) <= set(ckpt.model)
        assert logged.fingerprints == {n: fingerprint(ckpt.model[n]) for n in logged.fingerprints}
        assert logged.fingerprints == param_records(run, step - 1)
        if step < steps[-1]:  # and the step is exact: the update of `step` itself is not in the checkpoint
            after = param_records(run, step)
            assert all(after[n] != fingerprint(ckpt.model[n]) for n in after)


def test_a_checkpoint_changed_with_its_manifest_is_refused_naming_file_tensor_and_step(run_factory) -> None:
    run = run_factory("golden")
    name = tamper_both(run, 2)
    with pytest.raises(CheckpointChangedError, match=CHANGED) as caught:
        load_checkpoint(run, 2)
    assert repr(name) in str(caught.value) and "\n" not in str(caught.value)
    load_checkpoint(run, 4)  # the others are untouched


def test_a_log_without_parameter_records_says_nothing_more(run_factory) -> None:
    run = run_factory("golden")
    tamper_both(run, 2)
    for seg in rank_dir(run, 0).iterdir():
        seg.unlink()
    ckpt = load_checkpoint(run, 2)  # no log: only the manifest's check, which the copy passes
    assert isinstance(ckpt.model, dict) and all(isinstance(t, torch.Tensor) for t in ckpt.model.values())
