"""The fault emulator's C++ gate (faults/emulator_gate.cpp), built and loaded like tracer's digest kernel.

    python -m faults.emulator_kernel   # build it (``make venv`` does); prints where it went

Without it every call of an op a rule names goes through the emulator's Python kernel: the same faults, about
4 us more a call.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tracer.kernel import Kernel, build_main

GATE = Kernel(
    "sdctrace_emulator_gate",
    Path(__file__).with_name("emulator_gate.cpp"),
    "fault emulator's gate",
    "the fault emulator sees every call of the ops its rules name in Python (same faults, slower)",
)

if __name__ == "__main__":
    sys.exit(build_main(GATE, sys.argv[1:]))
