"""RQ1 and RQ2 metrics, computed from full suspect and golden tensors.

Mismatch frequency is the fraction of elements whose *bits* differ (so -0.0 vs
0.0 and NaN payloads count). Mismatch severity is the mean relative difference
|s - g| / |g| over the differing elements whose golden value is nonzero; differing
elements with g = 0 have no relative difference and are counted in
``zero_golden`` instead. A non-finite suspect value makes the severity infinite.
Noise-to-signal is ||g_s - g_h||_2 / ||g_h||_2, in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Mismatch:
    elements: int
    mismatched: int
    frequency: float
    severity: float | None  # None when no element with a nonzero golden value differs
    max_rel: float
    zero_golden: int

    def fields(self) -> dict:
        return {
            "elements": self.elements,
            "mismatched": self.mismatched,
            "frequency": self.frequency,
            "severity": self.severity,
            "max_rel": self.max_rel,
            "zero_golden": self.zero_golden,
        }


def mismatch(suspect: torch.Tensor, golden: torch.Tensor) -> Mismatch:
    """Compare two tensors element by element, bit for bit."""
    if suspect.shape != golden.shape or suspect.dtype != golden.dtype:
        raise ValueError(
            f"cannot compare {suspect.dtype}{list(suspect.shape)} with golden {golden.dtype}{list(golden.shape)}"
        )
    s, g = suspect.detach().reshape(-1), golden.detach().reshape(-1)
    view = _INT_VIEW[s.element_size()]
    differ = s.contiguous().view(view) != g.contiguous().view(view)
    n = s.numel()
    k = int(differ.sum())
    if k == 0:
        return Mismatch(n, 0, 0.0, None, 0.0, 0)
    sd, gd = s[differ].double(), g[differ].double()
    nonzero = gd != 0
    rel = (sd[nonzero] - gd[nonzero]).abs() / gd[nonzero].abs()
    rel = torch.where(torch.isnan(rel), torch.full_like(rel, math.inf), rel)
    severity = float(rel.mean()) if rel.numel() else None
    max_rel = float(rel.max()) if rel.numel() else 0.0
    return Mismatch(n, k, k / n, severity, max_rel, int((~nonzero).sum()))


@dataclass(frozen=True)
class Noise:
    name: str
    diff_l2: float
    golden_l2: float

    @property
    def ratio(self) -> float:
        if self.golden_l2 == 0:
            return 0.0 if self.diff_l2 == 0 else math.inf
        return self.diff_l2 / self.golden_l2

    def fields(self) -> dict:
        return {"name": self.name, "diff_l2": self.diff_l2, "golden_l2": self.golden_l2, "ratio": self.ratio}


TOTAL = "*"


def gradient_noise(suspect: Mapping[str, torch.Tensor], golden: Mapping[str, torch.Tensor]) -> list[Noise]:
    """Per-parameter noise and the total over all parameters (named ``"*"``)."""
    if set(suspect) != set(golden):
        missing = sorted(set(golden) ^ set(suspect))
        raise ValueError(f"suspect and golden gradients cover different parameters: {missing[:5]}")
    out = []
    diff_sq = gold_sq = 0.0
    for name in golden:
        g = golden[name].detach().double()
        d = suspect[name].detach().double() - g
        dn, gn = float(torch.linalg.vector_norm(d)), float(torch.linalg.vector_norm(g))
        diff_sq += dn * dn
        gold_sq += gn * gn
        out.append(Noise(name, dn, gn))
    out.append(Noise(TOTAL, math.sqrt(diff_sq), math.sqrt(gold_sq)))
    return out
