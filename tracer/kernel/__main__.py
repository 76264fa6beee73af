"""Build the fused digest kernel: ``python -m tracer.kernel [--verbose]``."""

from __future__ import annotations

import sys

from tracer.kernel import build


def main(argv: list[str]) -> int:
    try:
        path = build(verbose="--verbose" in argv)
    except Exception as e:  # the compiler's own output is above; one line says what to do
        print(f"sdctrace: building the digest kernel failed ({type(e).__name__}: {e}); tracing falls back to "
              "torch ops (same fingerprints, slower). Needs a C++17 compiler and ninja.", file=sys.stderr)
        return 1
    print(f"sdctrace digest kernel: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
