"""`AbftChecker`: algorithm-based fault tolerance for matrix multiplies.

    with AbftChecker(model, clock=lambda: (tracer.step_index, tracer.microbatch_index),
                     sink=lambda kind, fields: tracer.event(kind, **fields)):
        train()

For every ``mm``, ``addmm``, ``bmm``, ``baddbmm`` (and ``linear`` where a backend
dispatches it) of the forward and backward passes, C = beta*D + alpha*A@B is
checked by its checksums: the column sums of C against (1^T A) B and the row sums
against A (B 1), both recomputed in float64 from the op's own inputs. A difference
larger than the rounding error the op's dtype allows, ``safety * theta(k) * the
same checksums over |A|, |B|, |D|``, is a fault; docs/faults.md derives the bound.
Each check is logged as an ``abft`` event with the worst residual, its bound and
the verdict ("ok" or "flag").

ABFT sees only faults inside the multiply: a corrupted input (from a faulty
softmax, normalisation or elementwise op) gives a consistent product, and the
fused attention op is not a plain product, so neither is checked — the study's
reason why ABFT misses much real silent corruption.

Enter it after the fault emulator so it checks the corrupted results; its own
arithmetic (a C++ kernel on the CPU, torch ops under ``own_ops()`` elsewhere) is
never corrupted.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, final

import torch
from torch import nn

from faults.abft_kernel import ABFT
from faults.scope import ModuleScope, ScopedInterceptor
from tracer import kernel
from tracer.compiled import refuse_compiled
from tracer.errors import TraceWarning
from tracer.intercept import Call, Clock, Sink, own_ops
from tracer.log.records import Phase
from tracer.sites import find_sites, sites_named
from tracer.torch_internals import GROUPED_MM

aten = torch.ops.aten
# _grouped_mm: a mixture-of-experts layer's experts in one call, each group checked as one mm (`_grouped_check`).
_GROUPED = GROUPED_MM
CHECKED = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.linear, *((_GROUPED,) if _GROUPED else ())})
SAFETY = 2.0


@final  # `type(got) is AbftResult` then tells the checker what else got is
@dataclass(frozen=True)
class AbftResult:
    shape: tuple[int, int, int]  # m, k, n of one product
    residual: float  # |checksum of C - checksum from A, B, D| at the worst row or column
    bound: float  # the rounding-error bound there
    flagged: bool


def error_factor(k: int, dtype: torch.dtype, device: torch.device) -> float:
    """theta: |fl(C) - C| <= theta * (|alpha||A||B| + |beta||D|) elementwise, inner dimension k."""
    u_in, u_acc, u_out = _roundoffs(dtype, device)
    n = k + 2  # k products, the bias term, one scaling by alpha or beta
    if n * u_acc >= 1:
        return math.inf
    gamma = n * u_acc / (1 - n * u_acc)
    return (1 + u_in) ** 2 * (1 + gamma) * (1 + u_out) - 1


@functools.lru_cache(maxsize=1024)
def _cpu_error_factor(k: int, dtype: torch.dtype) -> float:
    """`error_factor` on the CPU, where no backend flag changes it: one look-up per check, not a microsecond."""
    return error_factor(k, dtype, torch.device("cpu"))


def _roundoffs(dtype: torch.dtype, device: torch.device) -> tuple[float, float, float]:
    """Unit roundoffs of the inputs as the unit reads them, of its accumulator, of the stored result."""
    cuda = device.type == "cuda"
    m = torch.backends.cuda.matmul
    if dtype == torch.float64:
        return 0.0, 2.0**-53, 0.0
    if dtype == torch.float32:
        return (2.0**-11 if cuda and m.allow_tf32 else 0.0), 2.0**-24, 0.0
    if dtype == torch.bfloat16:
        return 0.0, (2.0**-8 if cuda and m.allow_bf16_reduced_precision_reduction else 2.0**-24), 2.0**-8
    if dtype == torch.float16:
        return 0.0, (2.0**-11 if cuda and m.allow_fp16_reduced_precision_reduction else 2.0**-24), 2.0**-11
    return 0.0, math.inf, 0.0  # no model for this dtype: the bound is vacuous


def check_matmul(func: Any, args: tuple, kwargs: dict, out: torch.Tensor, safety: float = SAFETY) -> AbftResult | None:
    """Check one call of a ``CHECKED`` op against its result ``out``: on the CPU with the built kernel
    (faults/abft_sums.cpp), elsewhere, or without it, with torch ops; the same checksums and verdict either way.
    Its own ops are never seen by interceptors (the kernel runs none) nor recorded by autograd. None: a form of
    ``_grouped_mm`` it has no check for."""
    got = _verdict(func, args, kwargs, out, safety)
    if got is None or type(got) is AbftResult:
        return got
    m, k, n, residual, bound, flagged = got
    return AbftResult((m, k, n), residual, bound, flagged)


Verdict = tuple[int, int, int, float, float, bool]
"""The kernel's answer: (m, k, n, residual, bound, flagged), as `AbftResult` holds it."""


def _verdict(func: Any, args: tuple, kwargs: dict, out: torch.Tensor, safety: float) -> Verdict | AbftResult | None:
    """`check_matmul`, with the kernel's answer as the kernel gives it: the checker takes it apart itself, as the
    Python around each checked product adds up over the hundreds a step."""
    packet = func.overloadpacket
    if packet is _GROUPED:
        return _grouped_check(args, kwargs, out, safety)
    module = (_kernel_state[0] if _kernel_state else _kernel()) if out.device.type == "cpu" else None
    if module is not None:
        a, b, d, alpha, beta = _kernel_operands(packet, args, kwargs)
        k = b.shape[-1] if packet is aten.linear else a.shape[-1]
        got = module.check(a, b, out, d, alpha, beta, safety * _cpu_error_factor(k, out.dtype), packet is aten.linear)
        if got is not None:  # None: operands it does not read (mixed dtypes, another layout)
            return got
    return torch_check(func, args, kwargs, out, safety)


def _grouped_check(args: tuple, kwargs: dict, out: torch.Tensor, safety: float) -> AbftResult | None:
    """``_grouped_mm(A, B, offs)``: each group's product checked as one ``mm``; the worst group's result. Groups
    split the rows of a 2-D A by a 3-D B (the experts' forward), or the inner dimension of two 2-D operands (their
    weight gradients, one (m, n) result per group); None for another form, a bias or another output dtype."""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    bias = args[3] if len(args) > 3 else kwargs.get("bias")
    if offs is None or bias is not None or out.dtype != a.dtype or a.dim() != 2:
        return None
    ends = offs.tolist()
    spans = list(zip([0, *ends[:-1]], ends))
    if b.dim() == 3 and len(spans) == b.shape[0]:
        groups = [(a[s:e], b[g], out[s:e]) for g, (s, e) in enumerate(spans)]
    elif b.dim() == 2 and out.dim() == 3 and len(spans) == out.shape[0]:
        groups = [(a[:, s:e], b[s:e], out[g]) for g, (s, e) in enumerate(spans)]
    else:
        return None
    # mm is always checked (None is for a grouped form only)
    results = [r for x, y, z in groups if (r := check_matmul(aten.mm.default, (x, y), {}, z, safety)) is not None]
    return max(results, key=lambda r: (r.flagged, r.residual / r.bound if r.bound > 0 else 0.0))


def torch_check(func: Any, args: tuple, kwargs: dict, out: torch.Tensor, safety: float = SAFETY) -> AbftResult:
    """`check_matmul` by torch ops, on any device."""
    with own_ops(), torch.no_grad():
        return _torch_verdict(*torch_residuals(func, args, kwargs, out, safety))


def _torch_verdict(residual: torch.Tensor, bound: torch.Tensor, shape: tuple[int, int, int]) -> AbftResult:
    if residual.numel() == 0:
        return AbftResult(shape, 0.0, 0.0, False)
    # Non-finite inputs make the check vacuous; a non-finite result from finite inputs is a fault.
    bad = torch.isfinite(bound) & ~(residual <= bound)
    score = torch.where(bad, math.inf, torch.where(bound > 0, residual / bound, 0.0))
    worst = score.argmax()
    worst_residual, worst_bound, flagged = torch.stack([residual[worst], bound[worst], bad.any()]).tolist()
    return AbftResult(shape, worst_residual, worst_bound, bool(flagged))


def torch_residuals(
    func: Any, args: tuple, kwargs: dict, out: torch.Tensor, safety: float = SAFETY
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """Every check's residual and bound (float64, the batch's column checks then its row checks) and (m, k, n),
    by torch ops on any device: the fallback, and the kernel's reference."""
    a, b, d, alpha, beta = _operands(func, args, kwargs)
    c = out.reshape(a.shape[0], a.shape[1], b.shape[2])  # (batch, m, n)
    theta = error_factor(a.shape[2], out.dtype, out.device)
    a, b, c = a.double(), b.double(), c.double()
    a_abs, b_abs = a.abs(), b.abs()
    # Column sums (1^T C) and row sums (C 1), with the same sums over magnitudes, as vector-matrix
    # products: torch's CPU bmm of matrices by one column each is slow (7x at batch 2, 512 x 384).
    col = alpha * (a.sum(1, keepdim=True) @ b)  # (batch, 1, n): (1^T A) B
    row = alpha * (b.sum(2, keepdim=True).mT @ a.mT)  # (batch, 1, m): (A (B 1))^T
    col_mag = abs(alpha) * (a_abs.sum(1, keepdim=True) @ b_abs)
    row_mag = abs(alpha) * (b_abs.sum(2, keepdim=True).mT @ a_abs.mT)
    if d is not None:
        d = d.double()
        d_abs = d.abs().expand(c.shape)  # of D as given: a bias's magnitudes are a vector, not an m x n copy
        d = d.expand(c.shape)
        col, row = col + beta * d.sum(1, keepdim=True), row + beta * d.sum(2, keepdim=True).mT
        col_mag = col_mag + abs(beta) * d_abs.sum(1, keepdim=True)
        row_mag = row_mag + abs(beta) * d_abs.sum(2, keepdim=True).mT
    residual = torch.cat([(c.sum(1, keepdim=True) - col).flatten(), (c.sum(2, keepdim=True).mT - row).flatten()]).abs()
    bound = safety * theta * torch.cat([col_mag.flatten(), row_mag.flatten()])
    return residual, bound, (a.shape[1], a.shape[2], b.shape[2])


def _kernel_operands(
    packet: Any, args: tuple, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float, float]:
    """(A, B, D or None, alpha, beta) as the op took them, no views: what the kernel reads."""
    if packet is aten.linear:
        return args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"), 1.0, 1.0
    if packet is aten.mm or packet is aten.bmm:
        return args[0], args[1], None, 1.0, 1.0
    alpha, beta = float(kwargs.get("alpha", 1)), float(kwargs.get("beta", 1))
    return args[1], args[2], args[0] if beta != 0 else None, alpha, beta  # addmm, baddbmm


# -- the checksum kernel ------------------------------------------------------------------------
ABFT_ENV = "SDCTRACE_ABFT"  # "torch": check with torch ops even where the kernel is built
_kernel_state: list[ModuleType | None] = []  # [] until the first CPU check looks
_kernel_lock = threading.Lock()


def _kernel() -> ModuleType | None:
    """The built kernel, loaded at the first CPU check; None (said once) when it is not there."""
    if _kernel_state:
        return _kernel_state[0]
    return kernel.load_once(
        ABFT,
        _kernel_state,
        _kernel_lock,
        ABFT_ENV,
        "sdctrace's ABFT checksum kernel is not built for this torch and Python, so the checker recomputes "
        "checksums with torch ops: the same verdicts, several times the cost per matmul. Build it once with "
        "`python -m faults.abft_kernel` (needs a C++ compiler and ninja; `make venv` does it).",
    )


def abft_implementation() -> str:
    """Which implementation CPU checks use here: "kernel" or "torch"; benchmarks print it."""
    return "kernel" if _kernel() is not None else "torch"


def _operands(
    func: Any, args: tuple, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float, float]:
    """(A (batch, m, k), B (batch, k, n), D broadcastable to (batch, m, n) or None, alpha, beta)."""
    packet = func.overloadpacket
    a, b, d, alpha, beta = _kernel_operands(packet, args, kwargs)
    if packet is aten.linear:
        return a.reshape(1, -1, b.shape[1]), b.t()[None], d, alpha, beta
    if packet is aten.mm or packet is aten.addmm:
        return a[None], b[None], d, alpha, beta
    return a, b, d, alpha, beta  # bmm, baddbmm


_PHASE_NAMES = {p: p.name.lower() for p in Phase}


class AbftChecker(ScopedInterceptor):
    """Check every matmul of the forward and backward passes while active; log each to ``sink``."""

    title = "ABFT checker"

    def __init__(
        self,
        model: nn.Module,
        *,
        clock: Clock,
        sink: Sink,
        sites: Sequence[str] | None = None,
        safety: float = SAFETY,
    ) -> None:
        super().__init__()
        refuse_compiled(model, self.title)
        self.safety = safety
        self._clock = clock
        self._sink = sink
        # The traced sites' names, as the Tracer matched them (`Tracer.site_names`); None: the model's default sites.
        self.scope = ModuleScope(find_sites(model) if sites is None else sites_named(model, sites))
        self.ops = CHECKED
        self._op_names: dict[Any, str] = {}  # str(op) runs Python code on every call
        self._said: set[str] = set()  # the sites whose unchecked products were reported

    def intercept(self, func: Any, args: tuple, kwargs: dict, call: Call) -> Any:
        out = call(*args, **kwargs)
        phase = self.scope.phase()
        if phase is None:
            return out
        got = _verdict(func, args, kwargs, out, self.safety)
        stack = self.scope.stack(phase)
        site = stack[-1] if stack else ""
        if got is None:
            self._unchecked(func, args, site)
            return out
        if type(got) is AbftResult:
            (m, k, n), residual, bound, flagged = got.shape, got.residual, got.bound, got.flagged
        else:
            m, k, n, residual, bound, flagged = got
        name = self._op_names.get(func) or self._op_names.setdefault(func, str(func))
        self._sink(
            "abft",
            {
                "microbatch": self._clock()[1],
                "site": site,
                "op": name,
                "phase": _PHASE_NAMES[phase],
                "shape": [m, k, n],
                "residual": residual,
                "bound": bound,
                "verdict": "flag" if flagged else "ok",
            },
        )
        return out

    def _unchecked(self, func: Any, args: tuple, site: str) -> None:
        """Say once per site that a product there goes unchecked (a form of ``_grouped_mm`` with no check)."""
        if site in self._said:
            return
        self._said.add(site)
        shapes = " x ".join(str(list(a.shape)) for a in args[:2])
        warnings.warn(
            f"the ABFT checker has no check for {func} with operands {shapes} at {site or 'the model'} "
            "(a bias, another output dtype, or a grouping it does not split); those products go "
            "unchecked and log no abft event",
            TraceWarning,
            stacklevel=2,
        )
