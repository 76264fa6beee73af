"""The private Lightning APIs workload/lightning.py relies on (workload/lightning_internals.py) exist in the shape it
expects; after an upgrade that removes or changes one, this fails naming it."""

from __future__ import annotations

import pytest

pytest.importorskip("pytorch_lightning")

from tracer.errors import ConfigError  # noqa: E402
from workload import lightning_internals  # noqa: E402


def test_every_private_lightning_api_is_present() -> None:
    missing = [api.message() for api in lightning_internals.missing_apis()]
    assert not missing, "\n".join(missing)


def test_each_api_names_itself_and_the_feature_that_needs_it() -> None:
    names = [api.name.split("(")[0] for api in lightning_internals.private_apis()]
    assert names == [
        "pytorch_lightning.core.optimizer._configure_optimizers",
        "pytorch_lightning.core.optimizer._configure_schedulers_automatic_opt",
        "lightning_fabric.utilities.data._set_sampler_epoch",
        "LightningModule._on_before_batch_transfer",
        "LightningModule._apply_batch_transfer_handler",
    ]
    for api in lightning_internals.private_apis():
        assert api.name in api.message() and "workload.lightning" in api.message()
        with pytest.raises(ConfigError, match="workload.lightning"):
            api.stand_in()()
