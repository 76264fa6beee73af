"""The torchtitan internals the torchtitan examples rely on to train torchtitan's own models on CPU with gloo (Llama3
under FSDP2 and TP, examples/torchtitan_llama3.py; Qwen3-MoE under expert parallelism, examples/torchtitan_moe.py;
Llama3 under pipeline parallelism, examples/torchtitan_pipeline.py), behind one public name each.

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
- Its MoE dispatcher asks for the ``spmd_types`` backend's mesh unless told the backend its ``Trainer`` sets
  ("'NoneType' object has no attribute 'get_group'"): `use_spmd_backend`.

For the Tracer: `expert_sites` runs a grouped-experts layer expert by expert, each a module named by its global
index, and observes the dispatcher's all-to-alls; `pipeline` makes torchtitan's pipeline stage a `TracedStage`
and `infer_stage_shapes` has torch's stage shape inference run before any Tracer sees it.

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
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining.schedules import PipelineScheduleSingle as ScheduleSingle
from torch.distributed.tensor import DTensor
from torchtitan.config.configs import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed import parallel_dims
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.utils import set_spmd_backend
from torchtitan.models import llama3, qwen3
from torchtitan.models.common.attention import QKVLinear, ScaledDotProductAttention
from torchtitan.models.common.config_utils import make_moe_config, make_routed_experts_config, make_router_config
from torchtitan.models.common.linear import Linear
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.sharding import set_llama3_sharding_config
from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

from tracer.collectives import observe
from tracer.log.records import Phase
from tracer.pipeline import TracedStage, received, sent
from tracer.torch_internals import PrivateApi

__all__ = [
    "Expert",
    "MoeShape",
    "debug_llama3",
    "debug_qwen3_moe",
    "expert_sites",
    "infer_stage_shapes",
    "missing_apis",
    "parallel_dims_of",
    "parallelize",
    "parallelize_moe",
    "pipeline",
    "private_apis",
    "separate_qkv",
    "sum_gradients",
    "use_cpu_meshes",
    "use_spmd_backend",
]

_FEATURE = "torchtitan example (examples/torchtitan_llama3.py)"
_MOE = "torchtitan MoE example (examples/torchtitan_moe.py)"
_PP = "torchtitan pipeline example (examples/torchtitan_pipeline.py)"
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


def parallel_dims_of(dp_shard: int, tp: int, **more: Any) -> tuple[ParallelDims, ParallelismConfig]:
    """torchtitan's description of ``dp_shard`` x ``tp`` ranks (tensor parallel innermost), DTensor-based;
    ``more``: other ``ParallelismConfig`` fields (``expert_parallel_degree``, ``pipeline_parallel_degree``, ...)."""
    parallelism = ParallelismConfig(
        data_parallel_shard_degree=dp_shard, tensor_parallel_degree=tp, spmd_backend="partial_dtensor", **more
    )
    pp = parallelism.pipeline_parallel_degree
    return ParallelDims.from_config(parallelism, dp_shard * tp * pp), parallelism


def parallelize(model: nn.Module, dims: ParallelDims, parallelism: ParallelismConfig, scratch: str) -> nn.Module:
    """torchtitan's own ``parallelize_llama``: TP where ``dims`` has it, then FSDP2 on each layer and the root; no
    compile, no activation checkpointing. ``scratch``: the folder torchtitan may dump into (it does not here)."""
    return _parallelize(model_registry(FLAVOR).parallelize_fn, model, dims, parallelism, scratch)


def _parallelize(
    fn: Callable[..., nn.Module], model: nn.Module, dims: ParallelDims, parallelism: ParallelismConfig, scratch: str
) -> nn.Module:
    return fn(
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


# --- Qwen3-MoE under expert parallelism (examples/torchtitan_moe.py) ---

MOE_FLAVOR = "debugmodel_moe"  # Qwen3-MoE's debug flavour: width 256, 8 layers of 64 experts, 8 per token


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """How far the debug Qwen3-MoE is cut for CPU: its first ``layers`` layers, ``experts`` experts of ``hidden``
    units each, ``top_k`` of them per token."""

    layers: int = 2
    experts: int = 4
    top_k: int = 2
    hidden: int = 64


def use_spmd_backend(parallelism: ParallelismConfig) -> None:
    """Make torchtitan's runtime helpers use ``parallelism``'s SPMD backend, as its ``Trainer`` does (its default,
    ``spmd_types``, leaves the MoE dispatcher without a mesh: "'NoneType' object has no attribute 'get_group'")."""
    set_spmd_backend(parallelism.spmd_backend)


def debug_qwen3_moe(parallelism: ParallelismConfig, shape: MoeShape) -> Any:
    """The config of torchtitan's debug Qwen3-MoE (``Qwen3Model.Config``) cut to ``shape``, with torchtitan's own
    router (softmax, top-k normalised) and grouped experts; causal SDPA and separate Q, K, V projections as in
    `debug_llama3`; no load balancing (its expert bias is moved by an optimizer hook of torchtitan's ``Trainer``);
    the sharding plan ``parallelism`` asks for (experts split over the ``ep`` ranks)."""
    config = qwen3.model_registry(MOE_FLAVOR).model
    config.layers = config.layers[: shape.layers]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention.qkv_linear = separate_qkv(layer.attention.qkv_linear)
        router, experts = layer.moe.router, layer.moe.routed_experts.inner_experts
        layer.moe = make_moe_config(
            num_experts=shape.experts,
            router=make_router_config(
                dim=config.dim,
                num_experts=shape.experts,
                gate_param_init=router.gate.param_init,
                top_k=shape.top_k,
                score_func=router.score_func,
                route_norm=router.route_norm,
            ),
            routed_experts=make_routed_experts_config(
                dim=config.dim,
                hidden_dim=shape.hidden,
                num_experts=shape.experts,
                top_k=shape.top_k,
                param_init=experts.param_init,
                comm_backend="standard",  # all-to-all by torch's functional collectives: gloo has them
            ),
            load_balance_coeff=None,
        )
    set_qwen3_sharding_config(
        config,
        enable_sp=parallelism.enable_sequence_parallel,
        enable_ep=parallelism.expert_parallel_degree > 1,
    )
    return config


def parallelize_moe(model: nn.Module, dims: ParallelDims, parallelism: ParallelismConfig, scratch: str) -> nn.Module:
    """torchtitan's own ``parallelize_qwen3``: experts split over the ``ep`` ranks, then FSDP2 on each layer and
    the root (the experts over ``efsdp``); no compile, no activation checkpointing."""
    return _parallelize(qwen3.model_registry(MOE_FLAVOR).parallelize_fn, model, dims, parallelism, scratch)


class Expert(nn.Module):
    """Expert ``index`` of a torchtitan ``GroupedExperts`` (``grouped``, local index), a module (so a site) of its
    own: no parameter, it computes what ``GroupedExperts.forward`` computes for its rows, from its slice of the
    grouped weights: SwiGLU in bfloat16 through the grouped module's ``_grouped_mm`` (torchtitan's seam for that
    product), cast back. Zero rows when the router sent it no token: its record then says so. Its one input is
    its rows, so its backward record is their gradient."""

    def __init__(self, grouped: GroupedExperts, index: int) -> None:
        super().__init__()
        self.weights = functools.partial(_expert_weights, grouped, index)  # a function, not a child module
        self.grouped_mm = grouped._grouped_mm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = self.weights()  # (1, F, D), (1, D, F), (1, F, D)
        offsets = torch.tensor([x.shape[0]], dtype=torch.int32, device=x.device)  # one group: all the rows
        a = x.bfloat16()  # (R, D)
        h = F.silu(self.grouped_mm(A=a, B_t=w1.bfloat16().transpose(-2, -1), offs=offsets))  # (R, F)
        h = h * self.grouped_mm(A=a, B_t=w3.bfloat16().transpose(-2, -1), offs=offsets)
        return self.grouped_mm(A=h, B_t=w2.bfloat16().transpose(-2, -1), offs=offsets).type_as(x)  # (R, D)


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if isinstance(w, DTensor) else w


def _expert_weights(grouped: GroupedExperts, index: int) -> tuple[torch.Tensor, ...]:
    """Local expert ``index``'s slices of ``grouped``'s weights, as its forward sees them (FSDP2 unsharded)."""
    return tuple(_local(w)[index : index + 1] for w in (grouped.w1_EFD, grouped.w2_EDF, grouped.w3_EFD))


def _per_expert(experts: nn.ModuleDict) -> Callable[..., torch.Tensor]:
    """A ``GroupedExperts`` forward that sends each expert's rows through its own `Expert`: rows come
    expert-major, counted by ``tokens`` (one count per local expert, in the order of ``experts``)."""

    def forward(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        counts = tokens.tolist()
        assert len(counts) == len(experts), f"{len(counts)} token counts for {len(experts)} local experts"
        assert sum(counts) == x.shape[0], f"{sum(counts)} tokens counted for {x.shape[0]} rows"
        outputs, start = [], 0
        for expert, n in zip(experts.values(), counts, strict=True):
            outputs.append(expert(x[start : start + n]))  # (n, D), n = 0 included
            start += n
        return torch.cat(outputs)  # (R, D)

    return forward


def _observed(exchange: Callable[..., torch.Tensor], point: str) -> Callable[..., torch.Tensor]:
    """A token dispatcher's all-to-all with both sides observed as a collective (`tracer.collectives`), forward
    and backward (the gradient goes back the way the rows came)."""

    def run(x: torch.Tensor, *args: Any) -> torch.Tensor:
        x = observe(point, "all_to_all", Phase.FORWARD, "in", x)
        if x.requires_grad:
            x = x.view_as(x)
            x.register_hook(lambda g: observe(point, "all_to_all", Phase.BACKWARD, "out", g))
        y = observe(point, "all_to_all", Phase.FORWARD, "out", exchange(x, *args))
        if y.requires_grad:
            y.register_hook(lambda g: observe(point, "all_to_all", Phase.BACKWARD, "in", g))
        return y

    return run


def expert_sites(model: nn.Module, first: int) -> None:
    """Give each MoE layer of ``model`` one `Expert` module per local expert, ``layers.N.moe.experts.G`` under its
    global index ``G`` (``first`` is this rank's first), and observe its dispatch and combine all-to-alls
    (``layers.N.moe.dispatch`` / ``.combine``). Call after ``init_weights``: the experts own no state."""
    for name, layer in model.layers.items():
        moe = layer.moe
        grouped, dispatcher = moe.routed_experts.inner_experts, moe.routed_experts.token_dispatcher
        local = _local(grouped.w1_EFD).shape[0]
        moe.experts = nn.ModuleDict({str(first + j): Expert(grouped, j) for j in range(local)})
        grouped.forward = _per_expert(moe.experts)
        if isinstance(dispatcher, AllToAllTokenDispatcher) and dispatcher.ep_mesh is not None:
            dispatcher._dispatch_token_exchange = _observed(
                dispatcher._dispatch_token_exchange, f"layers.{name}.moe.dispatch"
            )
            dispatcher._combine_token_exchange = _observed(
                dispatcher._combine_token_exchange, f"layers.{name}.moe.combine"
            )


# --- the debug Llama3 under pipeline parallelism (examples/torchtitan_pipeline.py) ---


def pipeline(
    model: nn.Module,
    config: Any,
    dims: ParallelDims,
    parallelism: ParallelismConfig,
    training: TrainingConfig,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    scratch: str,
) -> tuple[Any, nn.Module, TracedStage]:
    """torchtitan's own ``pipeline_llm`` on ``model`` (the debug Llama3 of ``config``): this rank's stage of
    ``parallelism.pipeline_parallel_schedule``, its module parallelized by ``parallelize_llama`` (FSDP2 over the
    ``fsdp`` ranks), and the schedule. Three changes for the Tracer: the stage is a `TracedStage` (the schedule
    tells it each chunk's microbatch), its module's input and output are the pipeline's ``recv`` and ``send``
    (`tracer.pipeline`), and the schedule divides the gradients by its microbatches (torch's default; torchtitan
    divides its loss by the global token count instead). One stage per rank: (schedule, stage module, stage)."""
    spec = model_registry(FLAVOR)
    schedule, parts, _, _ = spec.pipelining_fn(
        model,
        parallel_dims=dims,
        training=training,
        parallelism=parallelism,
        compile_config=CompileConfig(),
        ac_config=None,
        dump_folder=scratch,
        device=torch.device("cpu"),
        model_config=config,
        parallelize_fn=spec.parallelize_fn,
        loss_fn=lambda pred, target: (loss(pred, target), None),
    )
    if len(parts) != 1:
        raise ValueError(f"{len(parts)} stages on this rank: only single-stage schedules (GPipe, 1F1B) are traced")
    stage, part = schedule._stage, parts[0]
    stage.__class__ = TracedStage  # a PipelineStage that tells the Tracer the microbatch; no state of its own
    schedule.scale_grads = True
    index = stage.stage_index
    if not stage.is_first:
        part.register_forward_pre_hook(lambda _, args: (received(args[0], index), *args[1:]))
    if not stage.is_last:
        part.register_forward_hook(lambda _, args, out: sent(out, index))
    return schedule, part, stage


def infer_stage_shapes(schedule: Any, stage: TracedStage, rows: int, seq: int) -> None:
    """Have ``schedule`` learn what its stages exchange now, for microbatches of ``rows`` x ``seq`` tokens: the
    stages send each other their shapes and run a forward and a backward on meta tensors. torch does it at the
    schedule's first step, where the Tracer would see it (torchtitan builds its stages without example inputs, so
    they cannot skip it); sites then record meta tensors, which replay, starting at a later step, would not see.
    A collective over the stages: call on every rank, after the stage's weights are in place."""
    tokens = torch.zeros(rows, seq, dtype=torch.long)  # (B, T)
    args = (tokens,) if stage.is_first else ()
    schedule._initialize_stage(args, {}, tokens if stage.is_last else None)


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
    PrivateApi(
        "torchtitan.models.common.moe.GroupedExperts: w1_EFD, w2_EDF, w3_EFD and _grouped_mm",
        _MOE,
        lambda: (
            callable(getattr(GroupedExperts, "_grouped_mm", None))
            and {"w1_EFD", "w2_EDF", "w3_EFD"} <= set(GroupedExperts.__init__.__code__.co_names)
        ),
        "torchtitan",
    ),
    PrivateApi(
        "AllToAllTokenDispatcher._dispatch_token_exchange and _combine_token_exchange",
        _MOE,
        lambda: all(
            callable(getattr(AllToAllTokenDispatcher, n, None))
            for n in ("_dispatch_token_exchange", "_combine_token_exchange")
        ),
        "torchtitan",
    ),
    PrivateApi(
        "torch.distributed.pipelining schedule's _stage, as torchtitan's pipeline_llm builds it",
        _PP,
        lambda: "_stage" in ScheduleSingle.__init__.__code__.co_names,
        "torch",
    ),
    PrivateApi(
        "torch.distributed.pipelining PipelineScheduleSingle._initialize_stage(args, kwargs, target)",
        _PP,
        lambda: (
            list(inspect.signature(ScheduleSingle._initialize_stage).parameters)[:4]
            == ["self", "args", "kwargs", "target"]
        ),
        "torch",
    ),
)


def private_apis() -> tuple[PrivateApi, ...]:
    """Every torchtitan internal this module relies on."""
    return _APIS


def missing_apis() -> list[PrivateApi]:
    """The internals the installed torchtitan lacks or has in another shape."""
    return [api for api in _APIS if not api.present()]
