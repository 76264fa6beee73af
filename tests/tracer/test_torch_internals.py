"""Every private torch API sdctrace relies on (tracer/torch_internals.py) exists on this torch in the shape
sdctrace expects; after an upgrade that removes one, this fails naming the API and the feature that needs it."""

from __future__ import annotations

import pytest
import torch

from tracer import torch_internals as ti
from tracer.errors import ConfigError


def test_every_private_torch_api_is_present() -> None:
    missing = [api.message() for api in ti.missing_apis()]
    assert not missing, "\n".join(missing)


def test_the_list_names_each_api_with_its_feature() -> None:
    names = [api.name for api in ti.private_apis()]
    assert len(names) == len(set(names))
    for expected in (
        "torch._C._current_graph_task_id",
        "torch._C._autograd._get_sequence_nr",
        "torch._C._dispatch_tls_set_dispatch_key_excluded",
        "torch.utils._pytree.tree_leaves",
        "torch._C._AutoDispatchBelowADInplaceOrView",
        "torch._dynamo.callback.on_compile_start",
        "torch.distributed.tensor._utils.compute_local_shape_and_global_offset",
        "torch.distributed._functional_collectives.AsyncCollectiveTensor.wait",
    ):
        assert expected in names
    assert all(api.feature for api in ti.private_apis())


def test_a_missing_api_says_which_and_who_needs_it() -> None:
    api = ti.PrivateApi("torch._C._foo", "fault scope", lambda: False)
    assert "torch._C._foo" in api.message() and "fault scope" in api.message()
    with pytest.raises(ConfigError, match=r"torch\._C\._foo.*fault scope"):
        api.stand_in()()


def test_the_helpers_behave_as_their_callers_expect() -> None:
    assert not ti.in_backward()
    seen: list[bool] = []
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: seen.append(ti.in_backward()))
    y.sum().backward()
    assert seen == [True]
    before = ti.autograd_sequence_nr()
    _ = x * 3
    assert isinstance(before, int) and ti.autograd_sequence_nr() > before
    assert ti.tree_leaves({"a": (1, [2, 3])}) == [1, 2, 3]
    t = torch.zeros(2)
    v = ti.version_counter(t)
    t.add_(1)
    assert ti.version_counter(t) == v + 1
    mm = torch.ops.aten.mm.default
    assert ti.op_name(mm) == "aten::mm" and not ti.op_is_mutable(mm) and ti.op_is_mutable(torch.ops.aten.add_.Tensor)
    assert isinstance(torch.ops.aten.mm, ti.OpOverloadPacket) and isinstance(mm, ti.OpOverload)
    key = ti.parse_dispatch_key("TESTING_ONLY_GenericMode")
    was = ti.dispatch_key_excluded(key)
    ti.set_dispatch_key_excluded(key, True)
    assert ti.dispatch_key_excluded(key)
    ti.set_dispatch_key_excluded(key, was)
