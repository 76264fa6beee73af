"""The guard through the framework callbacks: Lightning re-runs a step through its closure; a Hugging Face
Trainer cannot re-run, says so once, and its alarms still follow the policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults import load_profile
from faults.node import node_options
from tests.guard.support import kinds, params
from tests.integrations import hf_tiny, lightning_tiny
from tracer.errors import TraceWarning
from tracer.guard import Guard, LossSpike, NonFinite
from tracer.integrations.hf import SdcTraceCallback as HfCallback
from tracer.integrations.lightning import SdcTraceCallback as LightningCallback
from tracer.options import TraceOptions

FAULT_STEP = 3
GUARD = Guard(detectors=(NonFinite(), LossSpike(window=4, min_history=2)), on_deterministic="skip")


def stuck_head(tmp_path: Path, site: str) -> dict:
    """Callback options for a node with a persistent fault: one logit of the model's head ``site`` stuck at 1e4 at
    FAULT_STEP (the loss jumps)."""
    path = tmp_path / "stuck-head.toml"
    path.write_text(
        f'[[fault]]\nops = ["matmul"]\nsites = "{site}"\nphases = ["forward"]\nsteps = [{FAULT_STEP}]\n'
        'elements = 1\nkind = "stuck"\nvalue = 10000.0\npersistent = true\n',
        encoding="utf-8",
    )
    return node_options(load_profile(path))


def fit_lightning(out: Path, guard: Guard | None, node: dict) -> None:
    """lightning_tiny's module fitted one batch a step, so that Lightning's optimizer closure is the whole step."""
    import pytorch_lightning as pl

    cb = LightningCallback(
        out,
        out.name,
        seed=lightning_tiny.SEED,
        options=TraceOptions(sites=lightning_tiny.SITES),
        checkpoint_every=0,
        guard=guard,
        **node,
    )
    lightning_tiny.configure_determinism(lightning_tiny.SEED, threads=1)
    module = lightning_tiny.TinyLM()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=5,
        accumulate_grad_batches=1,
        gradient_clip_val=lightning_tiny.CLIP,
        deterministic=True,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(out) + "-lightning",
        callbacks=[cb],
    )
    trainer.fit(module)


def test_lightning_reruns_a_flagged_step_through_its_closure(tmp_path: Path) -> None:
    node = stuck_head(tmp_path, "head")
    fit_lightning(tmp_path / "unguarded", None, node)
    fit_lightning(tmp_path / "guarded", GUARD, node)
    (event,) = kinds(tmp_path / "guarded", "guard")
    f = event.fields
    assert event.step == FAULT_STEP and f["alarms"][0]["detector"] == "loss_spike"
    # The closure zeroes the gradients and runs training_step, backward and clipping again: the persistent fault's
    # gradients come out bit-identical, so one re-run settles it.
    assert (f["outcome"], f["action"]) == ("deterministic", "skip")
    assert [r["attempt"] for r in f["runs"]] == [0, 1] and f["runs"][0]["fingerprint"] == f["runs"][1]["fingerprint"]
    assert f["runs"][0]["loss"] > 100  # the closure's loss, as Lightning returns it
    for step in range(FAULT_STEP):
        assert params(tmp_path / "guarded", step) == params(tmp_path / "unguarded", step)
    assert params(tmp_path / "guarded", FAULT_STEP) == params(tmp_path / "guarded", FAULT_STEP - 1)


def test_lightning_with_accumulated_microbatches_warns_that_it_cannot_rerun(tmp_path: Path) -> None:
    with pytest.warns(TraceWarning, match="accumulate_grad_batches=2 Lightning's optimizer closure runs only"):
        lightning_tiny.record(tmp_path / "run", "node", guard=GUARD)
    assert kinds(tmp_path / "run", "guard") == []  # healthy: nothing fired


def test_hf_says_once_that_it_cannot_rerun(tmp_path: Path) -> None:
    with pytest.warns(TraceWarning, match="cannot re-run steps here: a Hugging Face Trainer runs each step"):
        HfCallback(tmp_path / "run", "node", guard=GUARD)


def test_hf_alarms_are_unclassified_and_follow_the_policy(tmp_path: Path) -> None:
    node = stuck_head(tmp_path, "lm_head")
    with pytest.warns(TraceWarning):
        hf_tiny.record(tmp_path / "run", "node", guard=GUARD, **node)
    (event,) = kinds(tmp_path / "run", "guard")
    f = event.fields
    assert event.step == FAULT_STEP and (f["outcome"], f["action"], f["accepted"]) == ("unclassified", "skip", None)
    assert [r["attempt"] for r in f["runs"]] == [0]
    assert params(tmp_path / "run", FAULT_STEP) == params(tmp_path / "run", FAULT_STEP - 1)
