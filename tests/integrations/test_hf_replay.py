"""Trainer runs under bf16 autocast and with BERT's dropout replay from any checkpoint; one that cannot is told why.

hf_tiny's runs have checkpoints at steps 0, 2, 4 and 5 and three steps an epoch (steps 3 and 4 are the second
epoch's): checkpoint 0 is taken before the first epoch's data loader iterator draws its base seed from the
global RNG, and the replay from checkpoint 2 crosses into the second epoch, whose iterator draws again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile
from sdc.cli import main
from tests.integrations import hf_tiny
from tests.integrations.conftest import fault_profile
from tests.support import events, rewrite_header
from tracer.compare import compare_runs
from tracer.errors import ValidationError
from tracer.integrations.hf import SdcTraceCallback
from tracer.log import LogReader, Phase, TensorRecord, rank_dir
from tracer.options import TraceOptions

pytestmark = pytest.mark.slow  # records real Trainer runs: seconds each

BF16 = {"variant": {"bf16": True}}
BERT = {"variant": {"bert": True}}


def replay(run: Path, steps: str, out: Path, profile: str = "healthy-node") -> Path:
    request = ReplayRequest(
        run,
        out,
        parse_steps(steps),
        suspect_from_profile(profile),
        mode="lockstep",
        workload=hf_tiny.WORKLOAD,
        progress=False,
    )
    Replayer(request).run()
    return out


def mismatched(out: Path) -> set[tuple[int, str, str]]:
    return {
        (e.step, e.fields["site"], e.fields["phase"]) for e in events(out, "site_mismatch") if e.fields["mismatched"]
    }


def forward_dtypes(run: Path) -> set[str]:
    return {
        r.meta.partition("[")[0]
        for r in LogReader(rank_dir(run, 0)).records()
        if isinstance(r, TensorRecord) and r.phase == Phase.FORWARD
    }


def test_a_bf16_autocast_run_replays_from_the_first_and_a_later_checkpoint(tmp_path: Path) -> None:
    run = hf_tiny.record(tmp_path / "run", "golden", config=BF16)
    assert forward_dtypes(run) == {"bfloat16"}  # accelerate's autocast ran the recording
    for steps in ("0:2", "4:5"):  # from checkpoint 0, and from checkpoint 4 (inside the second epoch)
        out = replay(run, steps, tmp_path / f"replay-{steps.replace(':', '-')}")
        assert events(out, "site_mismatch") and not mismatched(out)


def test_verify_determinism_runs_what_the_trainer_ran_for_the_steps_asked(tmp_path: Path) -> None:
    run = hf_tiny.record(tmp_path / "run", "golden", config=BF16)
    config = tmp_path / "bf16.toml"
    config.write_text("[variant]\nbf16 = true\n", encoding="utf-8")
    code = main(
        [
            "verify-determinism",
            "--workload",
            hf_tiny.WORKLOAD,
            "--config",
            str(config),
            "--steps",
            "2",
            "--keep",
            str(tmp_path / "verify"),
            "--quiet",
        ]
    )
    assert code == 0
    assert [e.step for e in events(tmp_path / "verify" / "a", "step")] == [0, 1]
    # The workload's steps are the Trainer's, autocast included, bit for bit.
    result = compare_runs(run, tmp_path / "verify" / "a")
    assert result.first is None and result.steps == 2 and result.events > 0


def test_a_bert_with_dropout_replays_from_every_checkpoint(tmp_path: Path) -> None:
    run = hf_tiny.record(tmp_path / "run", "golden", config=BERT)
    rng = events(run, "rng")
    assert [e.step for e in rng] == list(range(hf_tiny.STEPS))
    # Only where the Trainer drew from the RNG outside a step (each epoch's iterator) is the state stored.
    assert [e.step for e in rng if e.fields["stored"]] == [0, 3]
    for steps in ("0:2", "2:4", "4:5"):
        out = replay(run, steps, tmp_path / f"replay-{steps.replace(':', '-')}")
        assert events(out, "site_mismatch") and not mismatched(out)


def test_lockstep_with_dropout_isolates_the_faulty_site(tmp_path: Path) -> None:
    """The suspect's step draws the golden step's dropout masks: only the faulty site mismatches."""
    site, step = "bert.encoder.layer.1.attention", 2  # step 2 has one microbatch
    profile = tmp_path / "fault.toml"
    profile.write_text(fault_profile(site, step), encoding="utf-8")
    run = hf_tiny.record(tmp_path / "run", "golden", config=BERT)
    out = replay(run, f"{step}:{step + 2}", tmp_path / "replay", profile=str(profile))
    assert (step, site, "forward") in mismatched(out)
    assert mismatched(out) <= {(step, site, "forward"), (step, site, "backward")}


def test_a_replay_that_cannot_match_names_dropout_before_the_machine(tmp_path: Path) -> None:
    run = hf_tiny.record(tmp_path / "run", "golden", config=BERT)
    rewrite_header(run, drop="rng")  # as an sdctrace before `rng` events recorded it
    replay(run, "4:5", tmp_path / "inside-an-epoch")  # replayable as before where nothing drew between steps
    with pytest.raises(ValidationError) as caught:
        replay(run, "0:1", tmp_path / "first-epoch")
    message = str(caught.value)
    assert "bert.embeddings.dropout" in message and "dropout in training mode" in message
    assert "checkpoint 0" in message and "not deterministic" not in message


def test_a_replay_that_cannot_match_names_the_precision_before_the_machine(tmp_path: Path) -> None:
    # Recorded under bf16 autocast, but the header's config does not say so: the factory builds an fp32 Trainer.
    cb = SdcTraceCallback(tmp_path / "run", "golden", options=TraceOptions(sites=hf_tiny.SITES))
    trainer = hf_tiny.make_trainer(tmp_path / "hf", [cb], bf16=True)
    with cb:
        trainer.train()
    with pytest.raises(ValidationError) as caught:
        replay(tmp_path / "run", "0:1", tmp_path / "replay")
    message = str(caught.value)
    assert "bfloat16 in the recording and float32 here" in message and "autocast" in message
    assert "not deterministic" not in message
