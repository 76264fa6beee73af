"""The private transformers APIs workload/hf.py relies on (workload/hf_internals.py) exist in the shape it expects;
after an upgrade that removes or changes one, this fails naming it."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from workload import hf_internals  # noqa: E402


def test_every_private_transformers_api_is_present() -> None:
    missing = [api.message() for api in hf_internals.missing_apis()]
    assert not missing, "\n".join(missing)


def test_each_api_names_itself_and_the_feature_that_needs_it() -> None:
    apis = hf_internals.private_apis()
    assert [api.name.split("(")[0] for api in apis] == [
        "transformers.Trainer._clip_grad_norm",
        "transformers.Trainer._get_grad_norm",
    ]
    for api in apis:
        assert api.name in api.message() and "workload.hf" in api.message() and "transformers" in api.message()
