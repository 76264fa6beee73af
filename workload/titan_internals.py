"""The torchtitan internals examples/torchtitan_llama3.py relies on to train torchtitan's own Llama3 on CPU with gloo,
behind one public name each.

torchtitan (0.3.0, the ``[torchtitan]`` extra) is built for GPUs; four of its choices fail on CPU, gloo or DCP, each
measured:

- `ParallelDims` builds its device meshes on ``torchtitan.distributed.parallel_dims.device_type``, which is
  ``"cuda"`` on a machine without an accelerator: `use_cpu_meshes` sets it to ``"cpu"``.
- Its language models attend with flex attention, whose backward torch refuses on CPU ("FlexAttention does not
  support backward on CPU"): `debug_llama3` swaps each layer's inner attention for torchtitan's own causal
  ``ScaledDotProductAttention`` (the same attention on one document per row, no mask to build).
- Its fused Q, K, V projection saves a state dict torch's DCP cannot map back to modules: `debug_llama3` uses
  torchtitan's unfused ``QKVLinear``.
- ``parallelize_llama`` turns FSDP's gradient division off (it scales the loss by the global token count itself),
  and FSDP2 then reduce-scatters with ``ReduceOp.PREMUL_SUM(1.0)``, which gloo refuses ("Cannot use
  ReduceOp.PREMUL_SUM with Gloo"): `sum_gradients` makes FSDP reduce with a plain sum instead, the same numbers.

A torchtitan upgrade may rename or remove them; this module is where that shows
(tests/workload/test_titan_internals.py fails naming the API)::

    use_cpu_meshes()
    dims, parallelism = parallel_dims_of(dp_shard=2, tp=2)
    model_config = debug_llama3(parallelism)       # the debug flavour, causal SDPA in every layer
    model = parallelize(model, dims, parallelism)  # torchtitan's parallelize_llama: TP, then FSDP2
    sum_gradients(model)
    missing_apis()                                 # [] on the pinned torchtitan
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torchtitan.config.configs import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed import parallel_dims
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.models import llama3
from torchtitan.models.common.attention import QKVLinear, ScaledDotProductAttention
from torchtitan.models.common.linear import Linear
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.sharding import set_llama3_sharding_config

from tracer.torch_internals import PrivateApi

__all__ = [
    "debug_llama3",
    "missing_apis",
    "parallel_dims_of",
    "parallelize",
    "private_apis",
    "separate_qkv",
    "sum_gradients",
    "use_cpu_meshes",
]

_FEATURE = "torchtitan example (examples/torchtitan_llama3.py)"
FLAVOR = "debugmodel"


def use_cpu_meshes() -> None:
    """Build torchtitan's device meshes on CPU (gloo) rather than its default device, CUDA."""
    parallel_dims.device_type = "cpu"


def debug_llama3(parallelism: ParallelismConfig) -> Any:
    """The config of torchtitan's debug Llama3 (``Llama3Model.Config``), each layer attending causally with SDPA
    and projecting Q, K and V with three linears (`separate_qkv`), with the sharding plan ``parallelism`` asks for
    (what its ``update_from_config``, which torchtitan's ``Trainer`` calls, does; without it tensor parallel shards
    nothing. ``update_from_config`` itself imports the ``Trainer``, whose data loading needs torchdata)."""
    config = model_registry(FLAVOR).model
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention.qkv_linear = separate_qkv(layer.attention.qkv_linear)
    set_llama3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel)
    return config


def separate_qkv(fused: Any) -> QKVLinear.Config:
    """torchtitan's unfused Q, K, V projections in place of ``fused`` (a ``FusedQKVLinear.Config``), initialised
    alike (its Llama3 linear init). ``FusedQKVLinear`` saves its state dict split into ``wq``, ``wk`` and ``wv`` by
    a hook, which torch's DCP ``get_model_state_dict`` cannot map back to a module ("'FusedQKVLinear' object has no
    attribute 'wq'"), so sharded checkpoints need the unfused layout."""
    width, head = fused.wqkv.in_features, fused.head_dim
    return QKVLinear.Config(
        head_dim=head,
        wq=Linear.Config(in_features=width, out_features=fused.n_heads * head, param_init=llama3._LINEAR_INIT),
        wkv=Linear.Config(in_features=width, out_features=fused.n_kv_heads * head, param_init=llama3._LINEAR_INIT),
    )


def parallel_dims_of(dp_shard: int, tp: int) -> tuple[ParallelDims, ParallelismConfig]:
    """torchtitan's description of ``dp_shard`` x ``tp`` ranks (tensor parallel innermost), DTensor-based."""
    parallelism = ParallelismConfig(
        data_parallel_shard_degree=dp_shard, tensor_parallel_degree=tp, spmd_backend="partial_dtensor"
    )
    return ParallelDims.from_config(parallelism, dp_shard * tp), parallelism


def parallelize(model: nn.Module, dims: ParallelDims, parallelism: ParallelismConfig, scratch: str) -> nn.Module:
    """torchtitan's own ``parallelize_llama``: TP where ``dims`` has it, then FSDP2 on each layer and the root; no
    compile, no activation checkpointing. ``scratch``: the folder torchtitan may dump into (it does not here)."""
    return model_registry(FLAVOR).parallelize_fn(
        model,
        parallel_dims=dims,
        training=TrainingConfig(),
        parallelism=parallelism,
        compile_config=CompileConfig(),
        ac_config=None,
        dump_folder=scratch,
    )


def sum_gradients(model: nn.Module) -> None:
    """Make every FSDP2 module of ``model`` reduce gradients with a plain sum, which gloo has."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def _has_field(cls: type, name: str) -> bool:
    return dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}


_APIS = (
    PrivateApi(
        "torchtitan.distributed.parallel_dims.device_type",
        _FEATURE,
        lambda: isinstance(getattr(parallel_dims, "device_type", None), str),
        "torchtitan",
    ),
    PrivateApi(
        "torchtitan attention config's inner_attention field",
        _FEATURE,
        lambda: all(hasattr(layer.attention, "inner_attention") for layer in model_registry(FLAVOR).model.layers),
        "torchtitan",
    ),
    PrivateApi(
        "torchtitan.models.llama3._LINEAR_INIT",
        _FEATURE,
        lambda: isinstance(getattr(llama3, "_LINEAR_INIT", None), dict),
        "torchtitan",
    ),
    PrivateApi(
        "torchtitan.config.configs.ParallelismConfig.spmd_backend",
        _FEATURE,
        lambda: _has_field(ParallelismConfig, "spmd_backend"),
        "torchtitan",
    ),
)


def private_apis() -> tuple[PrivateApi, ...]:
    """Every torchtitan internal this module relies on."""
    return _APIS


def missing_apis() -> list[PrivateApi]:
    """The internals the installed torchtitan lacks or has in another shape."""
    return [api for api in _APIS if not api.present()]
