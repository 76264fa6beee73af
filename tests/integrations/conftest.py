"""Real runs for the integration tests, recorded once per framework: ``golden``, its ``twin``, and ``sick``, a node
whose emulated fault (`fault_profile`) hits the framework module's FAULT_SITE in forward at FAULT_STEP, a step of one
microbatch. Golden and sick keep their full gradients of that step (CapturePolicy), the test's independent truth."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from faults import load_profile
from faults.node import node_options
from tracer.log import Phase
from tracer.options import CapturePolicy

# modules of tests.integrations (record(), build(), FAULT_SITE, FAULT_STEP, SITES, WORKLOAD), and the package each needs
FRAMEWORKS = {"hf_tiny": "transformers", "lightning_tiny": "pytorch_lightning"}
# Without an extra installed, its own test module is not collected and its end-to-end parameter is skipped.
collect_ignore = [
    f"test_{name.removesuffix('_tiny')}.py"
    for name, package in FRAMEWORKS.items()
    if importlib.util.find_spec(package) is None
]


@dataclass(frozen=True)
class Recorded:
    framework: ModuleType
    golden: Path
    twin: Path
    sick: Path
    profile: Path  # the sick node's fault profile (TOML)


@pytest.fixture(scope="module", params=list(FRAMEWORKS))
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    pytest.importorskip(FRAMEWORKS[request.param], reason="install the extras: pip install -e '.[hf,lightning]'")
    fw = importlib.import_module(f"tests.integrations.{request.param}")
    root = tmp_path_factory.mktemp(request.param)
    path = root / "fault.toml"
    path.write_text(fault_profile(fw.FAULT_SITE, fw.FAULT_STEP), encoding="utf-8")
    grads = CapturePolicy(steps=frozenset({fw.FAULT_STEP}), phases=frozenset({Phase.GRAD}))
    return Recorded(
        framework=fw,
        golden=fw.record(root / "golden", "golden", capture=grads),
        twin=fw.record(root / "twin", "twin"),
        sick=fw.record(root / "sick", "sick", capture=grads, **node_options(load_profile(path))),
        profile=path,
    )


def fault_profile(site: str, step: int) -> str:
    """A profile that scales a few elements of ``site``'s forward matmul results by 8 at ``step``, and nowhere else."""
    rule = {
        "ops": ["matmul"],
        "sites": re.escape(site),
        "phases": ["forward"],
        "steps": [step],
        "elements": 4,
        "kind": "scale",
        "factor": 8.0,
    }
    lines = [f"{key} = {json.dumps(value)}" for key, value in rule.items()]  # JSON's strings and lists are TOML's
    return "\n".join([f'description = "{site} forward matmuls x8 at step {step}"', "seed = 7", "[[fault]]", *lines])
