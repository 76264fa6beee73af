"""XLA tests run on the XLA CPU device in `make test-xla`'s own environment (docs/xla.md).

Elsewhere torch_xla is not importable and every test here is skipped.
"""

from __future__ import annotations

import os

import pytest

# Before torch_xla initialises its runtime: without it, torch_xla looks for a TPU.
os.environ.setdefault("PJRT_DEVICE", "CPU")

SKIP_REASON = "torch_xla is not importable here; `make test-xla` runs these in .venv-xla (docs/xla.md)"


def xla_metrics():  # noqa: ANN201 - torch_xla.debug.metrics
    """torch_xla's metrics module, or a skip where torch_xla is missing."""
    pytest.importorskip("torch_xla", reason=SKIP_REASON)
    import torch_xla.debug.metrics as met

    return met


def samples(met, name: str) -> int:  # noqa: ANN001
    """How many times torch_xla has timed ``name`` (ExecuteTime: graphs run; TransferFromDeviceTime: reads)."""
    data = met.metric_data(name)
    return data[0] if data else 0
