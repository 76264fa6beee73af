"""The ABFT checksum kernel (faults/abft_sums.cpp), built and loaded like tracer's digest kernel.

    python -m faults.abft_kernel     # build it (``make venv`` does); prints where it went

Without it `faults.abft` checks with torch ops: the same verdicts, several times the cost per matmul.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tracer.kernel import Kernel, build_main

ABFT = Kernel(
    "sdctrace_abft",
    Path(__file__).with_name("abft_sums.cpp"),
    "ABFT checksum kernel",
    "the ABFT checker falls back to torch ops (same verdicts, slower)",
)

if __name__ == "__main__":
    sys.exit(build_main(ABFT, sys.argv[1:]))
