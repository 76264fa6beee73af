"""The private ``transformers.Trainer`` APIs `workload.hf` relies on, behind one public name each.

A transformers upgrade may rename or remove them; this module is where that shows
(tests/integrations/test_hf_internals.py fails naming the API)::

    norm = clip_grad_norm(trainer, model)        # Trainer._clip_grad_norm
    take_grad_norm(trainer, model, norm)          # Trainer._get_grad_norm
    missing_apis()                                # [] on the pinned transformers
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import Trainer

from tracer.torch_internals import PrivateApi

_FEATURE = "replay of a Hugging Face Trainer run (workload.hf)"


def clip_grad_norm(trainer: Trainer, model: nn.Module) -> torch.Tensor | float:
    """Clip the gradients as ``Trainer`` does between backward and the optimizer step; the norm before clipping."""
    return trainer._clip_grad_norm(model)


def take_grad_norm(trainer: Trainer, model: nn.Module, norm: Any) -> Any:
    """What ``Trainer`` does with the step's gradient norm (given by `clip_grad_norm`, or None without clipping:
    it then takes the norm itself), so a replayed step computes what the recorded one did."""
    return trainer._get_grad_norm(model, grad_norm=norm)


def _method(name: str, *params: str) -> bool:
    method = getattr(Trainer, name, None)
    return callable(method) and tuple(inspect.signature(method).parameters)[: len(params) + 1] == ("self", *params)


_APIS = (
    PrivateApi(
        "transformers.Trainer._clip_grad_norm(model)",
        _FEATURE,
        lambda: _method("_clip_grad_norm", "model"),
        "transformers",
    ),
    PrivateApi(
        "transformers.Trainer._get_grad_norm(model, grad_norm)",
        _FEATURE,
        lambda: _method("_get_grad_norm", "model", "grad_norm"),
        "transformers",
    ),
)


def private_apis() -> tuple[PrivateApi, ...]:
    """Every private transformers API this module relies on."""
    return _APIS


def missing_apis() -> list[PrivateApi]:
    """The private APIs the installed transformers lacks or has in another shape."""
    return [api for api in _APIS if not api.present()]
