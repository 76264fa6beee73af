"""Make a training process bit-reproducible, and say exactly how.

Every setting that can change the bits of a step is applied here and returned,
so the run header records it and a pair of runs can be checked for it.
"""

from __future__ import annotations

import os
import random
from typing import Any

import torch

from tracer.bit_settings import env_settings


def configure_determinism(seed: int, threads: int) -> dict[str, Any]:
    """Apply every determinism-relevant setting and return them for the run header."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    # CPU kernels split reductions across intra-op threads; a different thread count
    # changes the summation order and therefore the bits (seen on 1 vs 2 threads).
    torch.set_num_threads(threads)
    # cuBLAS picks non-deterministic split-K reductions unless its workspace is pinned;
    # must be set before the first cuBLAS handle is created.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Raise on any op that has no deterministic implementation instead of silently
    # producing run-to-run noise that would look like SDC.
    torch.use_deterministic_algorithms(True, warn_only=False)
    # Deterministic ops may still read uninitialised memory (torch.empty); fill it.
    # (a property of the module's class, which torch's stub does not declare)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]  # not in the stub
    # cuDNN autotuning chooses kernels by timing, which differs between runs.
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # TF32 changes matmul bits; keep full fp32 so CPU and GPU recordings agree in kind.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    # Every RNG a training step may touch.
    random.seed(seed)
    torch.manual_seed(seed)
    return determinism_settings()


def determinism_settings() -> dict[str, Any]:
    """The current values of every setting that `configure_determinism` controls, and the environment
    variables that change bits beyond it (``env``)."""
    return {
        "intra_op_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "fill_uninitialized_memory": bool(
            torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]  # not in the stub
        ),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        # The vector instruction set ATen's CPU kernels were picked for (AVX512, AVX2, DEFAULT...): the CPU's, or
        # ATEN_CPU_CAPABILITY's. Two widths sum in other orders: 981 of 1077 tensors of a llama3-16l-mini step
        # differed between AVX512 and AVX2 on one machine, where 1 and 2 threads gave the same bits.
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # NCCL's algorithm/protocol/NVLS choices, TF32 overrides, OpenMP/MKL threads (tracer.bit_settings).
        "env": env_settings(),
    }
