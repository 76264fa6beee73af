"""Op families: the aten operators a fault profile can name by one word.

Interceptors see ops after torch has decomposed composite functions, so a family
is a set of aten overload packets, forward and backward: ``nn.Linear`` arrives as
``addmm``/``mm`` (``linear`` itself only on backends that keep it), attention as
one fused ``_scaled_dot_product_*`` op per backend. Names this torch build lacks
are skipped, so a family means the same thing on every device.

The reference workload (CPU, float32 or bfloat16) dispatches, per family:

- matmul: ``mm`` (every linear layer, forward and both backward products),
  ``_scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``;
- softmax: ``_log_softmax`` and ``_log_softmax_backward_data`` (the loss; the
  softmax inside attention is fused into the attention op);
- normalisation: nothing, because its RMSNorm is written as elementwise ops
  (``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``); combine the elementwise and
  reduction families with a site pattern such as ``.*_norm`` to hit it;
- elementwise: ``add``, ``mul``, ``div``, ``pow``, ``rsqrt``, ``silu``, ... and
  their backward and in-place forms;
- reduction: ``mean``, ``sum`` (RMSNorm, bias-free linear backward).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tracer.collectives import OPS as COLLECTIVE_OPS
from tracer.errors import ConfigError
from tracer.torch_internals import GROUPED_MM, OpOverloadPacket

COLLECTIVE_FAMILY = "collective"  # every collective a model reports to `tracer.collectives`


def _packets(*names: str) -> frozenset[OpOverloadPacket]:
    return frozenset(getattr(torch.ops.aten, n) for n in names if hasattr(torch.ops.aten, n))


_ATTENTION = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_fused_attention_overrideable_backward",
)
_UNARY = (
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "silu",
    "gelu",
    "relu",
    "clamp",
)
_BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "where", "addcmul", "addcdiv", "lerp")

# GROUPED_MM: every expert of a mixture-of-experts layer in one call (its CPU kernel calls mm inside it).
_GROUPED: frozenset[OpOverloadPacket] = frozenset() if GROUPED_MM is None else frozenset({GROUPED_MM})

FAMILIES: dict[str, frozenset[OpOverloadPacket]] = {
    "matmul": _packets("mm", "addmm", "bmm", "baddbmm", "linear", "matmul", *_ATTENTION) | _GROUPED,
    "attention": _packets(*_ATTENTION),
    "softmax": _packets(
        "_softmax", "_log_softmax", "_safe_softmax", "_softmax_backward_data", "_log_softmax_backward_data"
    ),
    "normalisation": _packets(
        "native_layer_norm",
        "native_layer_norm_backward",
        "_fused_rms_norm",
        "_fused_rms_norm_backward",
        "native_group_norm",
        "native_group_norm_backward",
        "native_batch_norm",
        "native_batch_norm_backward",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
    ),
    "elementwise": _packets(
        *_UNARY,
        *_BINARY,
        *(n + "_" for n in _UNARY + _BINARY),
        "silu_backward",
        "gelu_backward",
        "threshold_backward",
        "sigmoid_backward",
        "tanh_backward",
    ),
    "reduction": _packets(
        "sum",
        "mean",
        "prod",
        "amax",
        "amin",
        "max",
        "min",
        "logsumexp",
        "linalg_vector_norm",
        "norm",
        "var",
        "std",
        "var_mean",
        "std_mean",
    ),
}


def resolve_ops(names: Iterable[str]) -> frozenset[OpOverloadPacket]:
    """Family names and aten op names (``mm`` or ``aten.mm``) to the packets they cover; collectives apart."""
    out: set[OpOverloadPacket] = set()
    for name in names:
        if name != COLLECTIVE_FAMILY and name not in COLLECTIVE_OPS:
            out |= FAMILIES.get(name) or {_aten(name)}
    return frozenset(out)


def resolve_collectives(names: Iterable[str]) -> frozenset[str]:
    """The collectives (`tracer.collectives.OPS`) named directly or by ``collective``."""
    out: set[str] = set()
    for name in names:
        out |= set(COLLECTIVE_OPS) if name == COLLECTIVE_FAMILY else {name} & set(COLLECTIVE_OPS)
    return frozenset(out)


def _aten(name: str) -> OpOverloadPacket:
    bare = name.removeprefix("aten.")
    packet = getattr(torch.ops.aten, bare, None) if bare.isidentifier() else None
    if not isinstance(packet, OpOverloadPacket):
        raise ConfigError(
            f"{name!r} is neither an op family ({', '.join([*FAMILIES, COLLECTIVE_FAMILY])}), a collective "
            f"({', '.join(COLLECTIVE_OPS)}) nor an aten op of this torch build"
        )
    return packet
