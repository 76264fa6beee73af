"""Tensor, sequence and data parallelism compute what the single-rank model computes, up to rounding."""

from __future__ import annotations

import pytest

from jobs.launch import launch
from tests.support import small_config
from workload.protocol import run_step
from workload.reference import build

pytestmark = pytest.mark.slow  # every test launches ranks as processes

STEPS = 2
TIMEOUT = 120  # seconds a rank may wait in one collective: a hung rank fails the test


def single_rank(cfg) -> tuple[list[float], dict[str, float]]:
    w = build(cfg)
    losses = [run_step(w, step) for step in range(STEPS)]
    return losses, {n: float(p.detach().double().pow(2).sum()) for n, p in w.model.named_parameters()}


@pytest.mark.parametrize(
    "layout", [["parallel.tp=2"], ["parallel.dp=2", "parallel.tp=2", "parallel.sp=true"]], ids=["tp2", "dp2-tp2-sp"]
)
def test_parallel_layout_matches_single_rank(layout: list[str]) -> None:
    base = ["model.n_layers=1", "train.threads=1", "data.batch_size=4"]
    cfg = small_config(*base, *layout)
    n = cfg.parallel.dp * cfg.parallel.tp
    results = launch(
        "tests.parallel.ranks:train_and_report", {"config": cfg.to_dict(), "steps": STEPS}, n, timeout_s=TIMEOUT
    )
    losses, squares = single_rank(small_config(*base))
    for r in results:
        assert r["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    # A sharded weight's squares, summed over one replica's tp ranks, are the whole weight's.
    replica = [r for r in results if r["coords"]["dp"] == 0]
    for name, whole in squares.items():
        if name in results[0]["sharded"]:
            got = sum(r["squares"][name] for r in replica)
        else:
            got = replica[0]["squares"][name]
            assert all(r["squares"][name] == got for r in results), f"{name} differs between ranks"
        assert got == pytest.approx(whole, rel=1e-4), name
