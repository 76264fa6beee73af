"""Lockstep on ``nn.Transformer``: a site that takes the same tensor three times (self-attention) or two
different ones (cross-attention) hands the layers before it only golden gradients, so a fault in one
attention's backward mismatches at that site alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.record import record_run
from replay.replayer import Replayer
from replay.request import ReplayRequest, parse_steps, suspect_from_profile
from tests.replay import torch_transformer
from tests.support import events
from tracer.options import TraceOptions

STEP = 1


def profile(tmp_path: Path, site: str) -> str:
    path = tmp_path / "fault.toml"
    path.write_text(
        f"""
description = "a few elements of every matmul in {site}'s backward scaled by 8 at step {STEP}"
seed = 7
[[fault]]
ops = ["matmul"]
sites = "{site.replace(".", "[.]")}"
phases = ["backward"]
steps = [{STEP}]
elements = 4
kind = "scale"
factor = 8.0
""",
        encoding="utf-8",
    )
    return str(path)


def lockstep_hits(tmp_path: Path, kind: str, sites: str | None, faulty: str) -> tuple[set[tuple[str, str]], set]:
    """Record a golden run of ``kind``, replay step 1 in lockstep against a fault in ``faulty``'s backward; the
    (site, phase) pairs that mismatched, and every (site, phase) compared."""
    config = {"model": {"kind": kind}, "run": {"steps": STEP + 1, "checkpoint_every": STEP}}
    golden = tmp_path / "golden"
    record_run(
        config,
        golden,
        node_label="golden",
        workload=torch_transformer.WORKLOAD,
        progress=False,
        trace=TraceOptions(sites=sites),
    )
    out = tmp_path / "lock"
    request = ReplayRequest(
        golden,
        out,
        parse_steps(f"{STEP}"),
        suspect_from_profile(profile(tmp_path, faulty)),
        mode="lockstep",
        workload=torch_transformer.WORKLOAD,
        progress=False,
    )
    Replayer(request).run()
    faults = events(out, "fault")
    assert faults and {(f.fields["site"], f.fields["phase"]) for f in faults} == {(faulty, "backward")}
    compared = events(out, "site_mismatch")
    hit = {(e.fields["site"], e.fields["phase"]) for e in compared if e.fields["mismatched"]}
    return hit, {(e.fields["site"], e.fields["phase"]) for e in compared}


@pytest.mark.parametrize("kind", ["torch", pytest.param("lightning", marks=pytest.mark.slow)])  # Lightning: 4 s import
def test_a_fault_in_self_attention_backward_mismatches_there_only(tmp_path: Path, kind: str) -> None:
    site = "transformer.encoder.layers.1.self_attn"
    hit, compared = lockstep_hits(tmp_path, kind, torch_transformer.SELF_ATTENTION, site)
    # self_attn(x, x, x): one tapped input, whose gradient sums all three uses and is overwritten as one.
    assert hit == {(site, "backward")}
    assert {s for s, _ in compared} == {
        f"transformer.{side}.layers.{i}.self_attn" for side in ("encoder", "decoder") for i in (0, 1)
    }


def test_a_fault_in_cross_attention_backward_mismatches_there_only(tmp_path: Path) -> None:
    site = "transformer.decoder.layers.1.multihead_attn"
    hit, compared = lockstep_hits(tmp_path, "torch", torch_transformer.ALL_ATTENTION, site)
    # multihead_attn(x, memory, memory): the gradients into x and into memory ([1]) both leave the site.
    assert hit == {(site, "backward"), (f"{site}[1]", "backward")}
    assert ("transformer.decoder.layers.0.multihead_attn[1]", "backward") in compared
