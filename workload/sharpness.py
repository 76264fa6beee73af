"""Sharpness: the top eigenvalue of the training loss's Hessian, from Hessian-vector products.

    s = sharpness(w, step, iterations=20)      # any workload.protocol.Workload, in the state before `step`
    s.value, s.iterations, s.converged, s.residual

RQ3 asks how fast a corrupted run drifts away from the healthy one; a perturbation grows
faster where the loss surface is sharp, so the golden run's sharpness is the yardstick the
drift rates are read against (docs/drift.md). The loss is that of the step's first
microbatch (``w.microbatches(step)[0]``), scaled back to the microbatch's own mean loss:
`Workload.loss` returns it divided by the number of microbatches.

The iteration is power iteration's Krylov refinement, Lanczos: each of the K iterations
costs one Hessian-vector product, like a power step, but the estimate is the largest Ritz
value of all K vectors. Plain power iteration finds the eigenvalue of largest *magnitude*;
on the reference model at initialisation that is a negative one (about -110 on ``tiny``,
still moving after 40 products), so it never showed the top eigenvalue. It stops early
once the estimate changes by at most ``tol`` (relative); memory: K parameter-sized vectors.

Hessian-vector products are exact (double backward, ``torch.autograd.grad(...,
create_graph=True)``). PyTorch's fused CPU attention kernel has no double backward, so
attention runs on SDPA's math backend here (the same function, other kernels). Should a
workload's ops still lack a double backward, the products fall back to central finite
differences of gradients, ``H v ~ (g(theta + eps v) - g(theta - eps v)) / (2 eps)``: ``method``
says which ran.

Nothing of the training changes: the start vector comes from a seeded generator of its
own, the global RNG state is restored, gradients are taken with ``torch.autograd.grad``
(``.grad`` untouched), and finite differences restore every parameter bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from tracer.errors import UsageError
from workload.protocol import Workload

EXACT, FINITE_DIFFERENCE = "hvp", "finite-difference"
Vector = list[torch.Tensor]  # one tensor per trainable parameter


@dataclass(frozen=True)
class Sharpness:
    """An estimate of the Hessian's largest (most positive) eigenvalue."""

    value: float  # the largest Ritz value
    iterations: int  # Hessian-vector products computed
    converged: bool  # the estimate changed by at most tol (relative) in the last iteration
    residual: float  # ||Hy - value y|| / |value| of its Ritz vector y: how far y is from an eigenvector
    method: str = EXACT  # EXACT or FINITE_DIFFERENCE
    microbatch: int = 0  # index of the microbatch whose loss it is


def sharpness(
    w: Workload,
    step: int,
    *,
    iterations: int = 20,
    tol: float = 1e-3,
    seed: int = 0,
    method: str = "auto",
    fd_eps: float = 1e-4,
) -> Sharpness:
    """The top Hessian eigenvalue of ``w``'s loss on step ``step``'s first microbatch, at the current parameters.

    ``method``: "auto" (exact, finite differences if double backward fails), EXACT or FINITE_DIFFERENCE;
    ``fd_eps``: the finite-difference step relative to the parameters' norm (on ``tiny``, float32: 1e-4 agrees
    with the exact value within 0.1 %, 1e-3 is 9 % low at initialisation, 1e-2 far off).
    """
    if iterations < 1:
        raise UsageError(f"sharpness: iterations must be >= 1, got {iterations}")
    if method not in ("auto", EXACT, FINITE_DIFFERENCE):
        raise UsageError(f"sharpness: method {method!r}; expected auto, {EXACT} or {FINITE_DIFFERENCE}")
    if w.layout.world_size > 1:
        raise UsageError("sharpness: a single-rank workload only (a rank's loss is a share of the model's)")
    params = [p for p in w.model.parameters() if p.requires_grad]
    batches = w.microbatches(step)
    scale = float(len(batches))  # Workload.loss divides by the number of microbatches

    def loss() -> torch.Tensor:
        return w.loss(step, batches[0]) * scale

    device = params[0].device
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        v0 = _start_vector(params, seed)
        if method in ("auto", EXACT):
            try:
                with _exact_hvp(loss, params) as hvp:
                    return _lanczos(hvp, v0, iterations, tol, EXACT)
            except RuntimeError as exc:
                if method == EXACT or "not implemented" not in str(exc):
                    raise
        return _lanczos(_finite_difference_hvp(loss, params, fd_eps), v0, iterations, tol, FINITE_DIFFERENCE)


def _start_vector(params: Sequence[torch.Tensor], seed: int) -> Vector:
    """A unit vector, the same for the same seed on every device (drawn on the CPU)."""
    gen = torch.Generator().manual_seed(seed)
    v = [torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.device, p.dtype) for p in params]
    return _scaled(v, 1.0 / _norm(v))


def _lanczos(hvp: Callable[[Vector], Vector], q: Vector, iterations: int, tol: float, method: str) -> Sharpness:
    """Power iteration refined: Lanczos keeps every Krylov vector (fully reorthogonalised), so the largest Ritz
    value reaches the top eigenvalue even where a larger negative one would capture plain power iteration."""
    basis: list[Vector] = [q]
    alphas: list[float] = []
    betas: list[float] = []
    value, residual, done = math.nan, math.nan, 0
    for done in range(1, iterations + 1):
        z = hvp(basis[-1])
        alphas.append(_dot(basis[-1], z))
        for b in basis:  # full reorthogonalisation: float32 products lose orthogonality within a few steps
            z = _axpy(z, -_dot(b, z), b)
        beta = _norm(z)
        ritz, vectors = torch.linalg.eigh(_tridiagonal(alphas, betas))
        previous, value = value, float(ritz[-1])
        residual = abs(beta * float(vectors[-1, -1])) / abs(value) if value else math.inf  # ||Hy - value y|| / |value|
        if abs(value - previous) <= tol * abs(value) or beta <= 1e-12 * abs(value):
            return Sharpness(value, done, True, residual, method)
        if not math.isfinite(beta) or beta == 0.0:
            break
        betas.append(beta)
        basis.append(_scaled(z, 1.0 / beta))
    return Sharpness(value, done, False, residual, method)


def _tridiagonal(alphas: list[float], betas: list[float]) -> torch.Tensor:
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        off = torch.tensor(betas, dtype=torch.float64)
        t += torch.diag(off, 1) + torch.diag(off, -1)
    return t


@contextmanager
def _exact_hvp(
    loss: Callable[[], torch.Tensor], params: Sequence[torch.Tensor]
) -> Iterator[Callable[[Vector], Vector]]:
    """H v by double backward through one graph of the gradient, kept for every product."""
    with sdpa_kernel([SDPBackend.MATH]):
        grads = torch.autograd.grad(loss(), params, create_graph=True)

        def hvp(v: Vector) -> Vector:
            out = torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True, allow_unused=True)
            return [o.detach() if o is not None else torch.zeros_like(p) for o, p in zip(out, params)]

        yield hvp


def _finite_difference_hvp(
    loss: Callable[[], torch.Tensor], params: Sequence[torch.Tensor], rel_eps: float
) -> Callable[[Vector], Vector]:
    """H v by central differences of gradients; the parameters are copied back bit for bit after each."""
    eps = rel_eps * max(_norm([p.detach() for p in params]), 1.0)

    def gradient_at(v: Vector, sign: float, saved: Vector) -> Vector:
        with torch.no_grad():
            for p, s, x in zip(params, saved, v):
                p.copy_(s + sign * eps * x)
        out = torch.autograd.grad(loss(), params, allow_unused=True)
        return [o.detach() if o is not None else torch.zeros_like(p) for o, p in zip(out, params)]

    def hvp(v: Vector) -> Vector:
        saved = [p.detach().clone() for p in params]
        try:
            plus, minus = gradient_at(v, 1.0, saved), gradient_at(v, -1.0, saved)
        finally:
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
        return [(a - b) / (2 * eps) for a, b in zip(plus, minus)]

    return hvp


def _dot(a: Vector, b: Vector) -> float:
    return float(sum(torch.sum(x.double() * y.double()) for x, y in zip(a, b)))


def _norm(a: Vector) -> float:
    return math.sqrt(_dot(a, a))


def _scaled(a: Vector, factor: float) -> Vector:
    return [x * factor for x in a]


def _axpy(y: Vector, a: float, x: Vector) -> Vector:
    return [yi + a * xi for yi, xi in zip(y, x)]
