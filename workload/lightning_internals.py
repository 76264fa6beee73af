"""The private Lightning APIs `workload.lightning` relies on, behind one public name each.

`workload.lightning` configures a module's optimizers and moves its batches as ``Trainer.fit`` does, which
Lightning does in private helpers. A Lightning upgrade may rename or remove them; this module is where that
shows (tests/integrations/test_lightning_internals.py fails naming the API)::

    optimizers, schedulers = configure_optimizers(module)    # _configure_optimizers + ..._automatic_opt
    set_sampler_epoch(loader, epoch)                          # lightning_fabric's _set_sampler_epoch
    batch = transfer_batch(module, batch)                     # _on_before_batch_transfer, _apply_batch_transfer_handler
    missing_apis()                                            # [] on the pinned Lightning
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.types import LRSchedulerConfig

from tracer.torch_internals import PrivateApi

_FEATURE = "replay of a Lightning run (workload.lightning)"
_OPTIMIZER = "pytorch_lightning.core.optimizer"
_DATA = "lightning_fabric.utilities.data"


def _private(module: str, name: str, *params: str) -> tuple[PrivateApi, Callable[..., Any]]:
    """The private function ``module.name`` whose first parameters are ``params``, with its `PrivateApi`; where
    Lightning lacks it, a stand-in that raises naming it."""

    def found() -> Callable[..., Any] | None:
        function = getattr(importlib.import_module(module), name, None)
        return function if callable(function) and _starts_with(function, params) else None

    api = PrivateApi(
        f"{module}.{name}({', '.join(params)})", _FEATURE, lambda: found() is not None, module.split(".")[0]
    )
    return api, found() or api.stand_in()


def _starts_with(function: Callable[..., Any], params: tuple[str, ...]) -> bool:
    return tuple(inspect.signature(function).parameters)[: len(params)] == params


def _module_method(name: str, *params: str) -> PrivateApi:
    return PrivateApi(
        f"LightningModule.{name}({', '.join(params)})",
        _FEATURE,
        lambda: callable(method := getattr(pl.LightningModule, name, None)) and _starts_with(method, ("self", *params)),
        "pytorch_lightning",
    )


_CONFIGURE = _private(_OPTIMIZER, "_configure_optimizers", "optim_conf")
_SCHEDULERS = _private(_OPTIMIZER, "_configure_schedulers_automatic_opt", "schedulers", "monitor")
_SAMPLER_EPOCH = _private(_DATA, "_set_sampler_epoch", "dataloader", "epoch")
_APIS = (
    _CONFIGURE[0],
    _SCHEDULERS[0],
    _SAMPLER_EPOCH[0],
    _module_method("_on_before_batch_transfer", "batch", "dataloader_idx"),
    _module_method("_apply_batch_transfer_handler", "batch", "device"),
)


def configure_optimizers(module: pl.LightningModule) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    """The module's optimizers and LR scheduler configs, from ``configure_optimizers()`` as ``Trainer.fit`` reads
    them under automatic optimization."""
    optimizers, schedulers, monitor = _CONFIGURE[1](module.configure_optimizers())
    return optimizers, _SCHEDULERS[1](schedulers, monitor)


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Tell the loader's samplers the epoch, as the fit loop does before each epoch."""
    _SAMPLER_EPOCH[1](loader, epoch)


def transfer_batch(module: pl.LightningModule, batch: Any) -> Any:
    """``batch`` after the module's batch hooks and on its device, as the fit loop hands it to ``training_step``."""
    batch = module._on_before_batch_transfer(batch, 0)
    return module._apply_batch_transfer_handler(batch, module.device)


def private_apis() -> tuple[PrivateApi, ...]:
    """Every private Lightning API this module relies on."""
    return _APIS


def missing_apis() -> list[PrivateApi]:
    """The private APIs the installed Lightning lacks or has in another shape."""
    return [api for api in _APIS if not api.present()]
