"""Small, real workload settings shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

from tracer.workload.config import Config, load_config

# A 2-layer model with short sequences and a handful of steps: real, but quick.
SMALL = ["model.n_layers=2", "data.batch_size=2", "data.seq_len=32", "run.steps=4", "run.checkpoint_every=2"]


def small_config(*overrides: str) -> Config:
    return load_config(None, [*SMALL, *overrides])
