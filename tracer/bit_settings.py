"""The settings outside torch that change a step's bits, as the run header records them, and how two headers
differ in them.

    env_settings()                        # {"NCCL_ALGO": "", "NCCL_PROTO": "LL128", ...}: "" where unset
    setting_differences(golden, suspect)  # [SettingDifference("determinism.env.NCCL_ALGO", "", "Ring", False, ...)]

`tracer.determinism.determinism_settings` adds `env_settings()` under the header's ``determinism.env``. A
difference refuses the pair (``refuses``) where it changes the bits of the device both runs used, and is a
warning elsewhere (an NCCL setting on a CPU run, TF32 on a CPU run): `tracer.pairing` and
`pipelines.pairing` report both kinds, naming the setting and both values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracer.log.records import RunHeader

# NCCL picks its all-reduce algorithm (ring, tree, NVLS, CollNet), protocol and channel count per message size
# and topology; each sums in another order. cuBLAS/TF32 overrides and OpenMP/MKL thread counts change compute.
NCCL_ENV = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NVLS_ENABLE",
    "NCCL_NVLSTREE_ENABLE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_NTHREADS",
    "NCCL_BUFFSIZE",
    "NCCL_TUNER_PLUGIN",
    "NCCL_ALGO_TUNER",
)
COMPUTE_ENV = (
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUBLASLT_WORKSPACE_SIZE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MKL_CBWR",
)
BIT_ENV = NCCL_ENV + COMPUTE_ENV
# determinism keys that change bits only on a CUDA device (CPU kernels read none of them, or have no
# nondeterministic implementation for the flags to forbid).
CUDA_BITS = frozenset(
    {
        "cublas_workspace_config",
        "cudnn_benchmark",
        "cudnn_deterministic",
        "cuda_matmul_allow_tf32",
        "cudnn_allow_tf32",
        "deterministic_algorithms",
        "deterministic_warn_only",
        "fill_uninitialized_memory",
        "NVIDIA_TF32_OVERRIDE",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
        "CUBLASLT_WORKSPACE_SIZE",
    }
)
# determinism keys that change bits only of ops on the CPU (`cpu_capability`: the vector width of ATen's CPU kernels).
CPU_BITS = frozenset({"cpu_capability"})
# Thread settings torch's own intra-op count (compared apart) overrides, or that run independent ops side by side.
NO_BITS = frozenset({"OMP_NUM_THREADS", "MKL_NUM_THREADS", "interop_threads"})
# Keys `tracer.pairing.PAIRING_FIELDS`' own check already refuses on (intra_op_threads).
CHECKED_ELSEWHERE = frozenset({"intra_op_threads"})


def env_settings() -> dict[str, str]:
    """The bit-changing environment variables of this process ("" where unset)."""
    return {name: os.environ.get(name, "") for name in BIT_ENV}


@dataclass(frozen=True)
class SettingDifference:
    """One bit-changing setting whose value differs between two runs' headers."""

    name: str  # e.g. "determinism.env.NCCL_ALGO"
    golden: Any
    suspect: Any
    refuses: bool  # the setting changes bits on the device both runs used: the runs do not pair
    why: str

    def describe(self) -> str:
        return f"{self.name}: {self.golden!r} vs {self.suspect!r} ({self.why})"


def setting_differences(golden: RunHeader, suspect: RunHeader) -> list[SettingDifference]:
    """Every recorded determinism setting (`determinism` and its ``env`` map) whose value differs. A key only
    one header holds was not recorded by the other's writer: not a difference."""
    out = []
    cuda = golden.device.startswith("cuda") and suspect.device.startswith("cuda")
    cpu = golden.device.startswith("cpu") and suspect.device.startswith("cpu")
    multi = golden.world_size > 1
    for name, a, b in _pairs(golden.determinism, suspect.determinism):
        key = name.rsplit(".", 1)[-1]
        if key in CHECKED_ELSEWHERE:
            continue
        if key in NCCL_ENV:
            refuses, why = (
                (True, "NCCL sums collectives in another order")
                if cuda and multi
                else (False, "changes bits only in NCCL collectives, which these runs did not use")
            )
        elif key in CUDA_BITS:
            refuses, why = (
                (True, "changes CUDA kernels' bits")
                if cuda
                else (False, "changes bits only on CUDA devices; these runs did not use one")
            )
        elif key in CPU_BITS:
            refuses, why = (
                (True, "selects the CPU kernels' vector width, which sums in another order")
                if cpu
                else (False, "changes the bits of CPU kernels; these runs computed on another device")
            )
        elif key in NO_BITS:
            refuses, why = False, "torch's intra-op thread count, which matches, decides reductions' order"
        else:
            refuses, why = True, "changes the bits of a step"
        out.append(SettingDifference(f"determinism.{name}", a, b, refuses, why))
    return out


def _pairs(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    out = []
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            out += _pairs(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append((f"{prefix}{key}", x, y))
    return out
