"""What the `sdc incident` tests share: `sdc` and a bundle's reproduce.py in fresh processes, and the check that a
bundle of a persistent emulated fault reproduces under the fault's emulation only.

    done = sdc("incident", "--golden", G, "--suspect", S, "--out", INC)        # CompletedProcess
    plain = reproduce_py(INC, repeats=3)                                        # python -I INC/reproduce.py --json
    assert_persistent_under_emulation_only(INC, profile, repeats=2)
    profile.write_text(down_proj_flip(step=2))    # a stuck unit in tests/integrations/hf_tiny's Llama
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from replay.bundle_reproduce import VERDICTS

ROOT = Path(__file__).resolve().parents[2]


def sdc(*argv: str) -> subprocess.CompletedProcess[str]:
    """`sdc` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "sdc.cli", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def reproduce_py(bundle: Path, repeats: int = 3) -> subprocess.CompletedProcess[str]:
    """The bundle's reproduce.py in a fresh, isolated interpreter (no sdctrace on its path): only torch; --json."""
    return subprocess.run(
        [sys.executable, "-I", str(bundle / "reproduce.py"), "--repeats", str(repeats), "--json"],
        cwd=bundle.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_persistent_under_emulation_only(bundle: Path, profile: Path, repeats: int = 2) -> dict[str, Any]:
    """reproduce.py alone (plain torch, a healthy machine) classifies *transient*; `sdc incident reproduce` under
    ``profile``'s emulation, in a fresh process, *persistent here*. Returns the emulated result."""
    plain = reproduce_py(bundle, repeats)
    assert plain.returncode == VERDICTS["transient"], plain.stdout + plain.stderr
    assert json.loads(plain.stdout)["runs_matching_golden"] == repeats
    emulated = sdc(
        "incident", "reproduce", str(bundle), "--fault-profile", str(profile), "--repeats", str(repeats), "--json"
    )
    assert emulated.returncode == VERDICTS["persistent here"], emulated.stdout + emulated.stderr
    result = json.loads(emulated.stdout)
    assert result["runs_matching_suspect"] == repeats
    return result


def stuck_bit(module: str, step: int, bit: int, *, elements: int = 1, stride: int | None = None) -> str:
    """A fault profile: bit ``bit`` of ``elements`` elements (``stride`` apart in the flat result when given, one
    lane of each warp) of the forward matmul of the module at path ``module`` at ``step``, a stuck unit
    (``persistent``): the emulated suspect of every incident test on a model of another library."""
    pattern = f"sites = '{re.escape(module)}'"  # a TOML literal string: the regex as it is
    return "\n".join(
        [
            f'description = "bit {bit} of {elements} element(s) of {module}\'s forward matmul at step {step}, stuck"',
            "seed = 7",
            "[[fault]]",
            'ops = ["matmul"]',
            pattern,
            'phases = ["forward"]',
            f"steps = [{step}]",
            f"elements = {elements}",
            *([f"stride = {stride}"] if stride else []),
            'kind = "bitflip"',
            f"bits = {bit}",
            "persistent = true",
            "",
        ]
    )


def down_proj_flip(step: int) -> str:
    """Bit 27 (an exponent bit of float32) of one element of tests/integrations/hf_tiny's
    model.layers.1.mlp.down_proj forward matmul at ``step``, a stuck unit."""
    return stuck_bit("model.layers.1.mlp.down_proj", step, 27)
