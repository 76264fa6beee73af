"""The input tensors of a microbatch: what `Tracer.microbatch` fingerprints, by one rule for every caller.

    tracer.microbatch(index, inputs=batch_tensors(batch))   # a tensor, a mapping, a tuple or list of them

Every integration and workload uses this rule, so a recording and its replay name the same inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def batch_tensors(batch: Any) -> torch.Tensor | tuple[torch.Tensor, ...] | None:
    """The tensors of a microbatch that `Tracer.microbatch` fingerprints as its input: the batch itself, or the
    tensors among a mapping's values or a sequence's items, in order. Every integration and workload uses this
    one rule, so a recording and its replay name the same inputs."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        return tuple(v for v in batch.values() if isinstance(v, torch.Tensor)) or None
    if isinstance(batch, (tuple, list)):
        return tuple(v for v in batch if isinstance(v, torch.Tensor)) or None
    return None
