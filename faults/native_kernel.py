"""faults' native kernel (faults/native.cpp), built and loaded like tracer's digest kernel.

    python -m faults.native_kernel   # build it (``make venv`` does); prints where it went

It holds the fault emulator's gate and the module scope's autograd-node labels. Without it the emulator sees
every call of the ops its rules name in Python (the same faults, about 4 us more a call) and the scope labels
nodes in Python (the same sites, about 3 % of a tiny step).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tracer.kernel import Kernel, build_main

NATIVE = Kernel(
    "sdctrace_faults_native",
    Path(__file__).with_name("native.cpp"),
    "faults' native kernel",
    "the fault emulator and the module scope run in Python (same faults and sites, slower)",
)

if __name__ == "__main__":
    sys.exit(build_main(NATIVE, sys.argv[1:]))
