"""Float bit patterns in the order of their values: the one ulp measure of the incident signature
(replay/signature.py) and the nondeterminism audit (pipelines/nondeterminism.py).

    positions = ordered(t.contiguous().reshape(-1).view(torch.int32), 32)   # float64: neighbouring floats 1 apart
    ulps = (ordered(a_bits, 32) - ordered(b_bits, 32)).abs()
"""

from __future__ import annotations

import torch


def ordered(bits: torch.Tensor, width: int) -> torch.Tensor:
    """Signed-integer views of IEEE floats ``width`` bits wide mapped to their positions in value order, as float64
    (a distance between two float64 positions can exceed int64), so that neighbouring floats are 1 apart and +0
    and -0 are both 0."""
    magnitude = (bits.to(torch.int64) & ((1 << (width - 1)) - 1)).to(torch.float64)
    return torch.where(bits < 0, -magnitude, magnitude)
