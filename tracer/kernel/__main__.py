"""Build the fused digest kernel: ``python -m tracer.kernel [--verbose]``."""

from __future__ import annotations

import sys

from tracer.kernel import DIGEST, build_main

if __name__ == "__main__":
    sys.exit(build_main(DIGEST, sys.argv[1:]))
