"""Real runs for the integration tests, recorded once per framework: ``golden``, its ``twin``, and ``sick``, a node
whose emulated fault (the framework module's FAULT_PROFILE) hits FAULT_SITE's forward at FAULT_STEP, a step of one
microbatch. Golden and sick keep their full gradients of that step (CapturePolicy), the test's independent truth."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from faults import load_profile
from faults.node import emulated_node, node_header
from tracer.log import Phase
from tracer.tracing import CapturePolicy

FRAMEWORKS = ("hf_tiny", "lightning_tiny")  # modules of tests.integrations: record(), build(), FAULT_*, SITES


@dataclass(frozen=True)
class Recorded:
    framework: ModuleType
    golden: Path
    twin: Path
    sick: Path
    profile: Path  # the sick node's fault profile (TOML)


@pytest.fixture(scope="module", params=FRAMEWORKS)
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    fw = importlib.import_module(f"tests.integrations.{request.param}")
    root = tmp_path_factory.mktemp(request.param)
    path = root / "fault.toml"
    path.write_text(fw.FAULT_PROFILE, encoding="utf-8")
    profile = load_profile(path)
    grads = CapturePolicy(steps=frozenset({fw.FAULT_STEP}), phases=frozenset({Phase.GRAD}))
    return Recorded(
        framework=fw,
        golden=fw.record(root / "golden", "golden", capture=grads),
        twin=fw.record(root / "twin", "twin"),
        sick=fw.record(
            root / "sick", "sick", capture=grads, extra=node_header(profile, 0, False),
            around=lambda tracer, model: emulated_node(tracer, model, fault_profile=profile, sites=fw.SITES),
        ),
        profile=path,
    )
