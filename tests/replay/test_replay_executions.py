"""Replay's executions per step, counted (a forward hook on the real model), and the shortcuts' replay log checked
event for event, bit for bit, against the path that runs every step as golden + suspect."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jobs.record import record_run
from replay.replayer import Replayer
from replay.request import MODES, ReplayRequest, parse_steps, suspect_from_profile
from tests.support import small_config
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord
from tracer.options import CapturePolicy, TraceOptions
from workload.model import Transformer


def rule(ops: str, layer: int, schedule: str) -> str:
    """A profile's rule: one mantissa flip in every call of ``ops`` inside ``layers.<layer>.feed_forward``."""
    return f"""
[[fault]]
ops = ["{ops}"]
sites = "layers\\\\.{layer}\\\\.feed_forward"
{schedule}
p_call = 1.0
elements = 1
kind = "bitflip"
bits = "mantissa"
"""


# Armed at steps 3 and 4 (a burst: 3 its first step, 4 a later one), firing on every matmul of one site there; a
# second rule is armed at step 5 but never fires (a feed-forward block runs no softmax); step 2 is armed by neither.
BURST = 'description = "a burst at steps 3 and 4, and a rule armed at step 5 that never fires"\nseed = 7\n' + (
    rule("matmul", 1, "steps = [3, 4]") + rule("softmax", 0, "steps = [5]")
)
# Armed in every step from 2 on by a rule that never fires, and firing at step 5 alone: a node whose faults are rare.
RARE = 'description = "armed on every step from 2, a fault at step 5 alone"\nseed = 7\n' + (
    rule("softmax", 0, "start = 2") + rule("matmul", 1, "steps = [5]")
)

MICROBATCHES = 2  # small_config's
# step: what it is, executions in param-sync, in lockstep
EXPECTED = {
    2: ("clean", 1, 1),
    3: ("faulty, the first step of a burst", 2, 2),
    4: ("faulty, a later step of the burst", 2, 2),
    5: ("armed, nothing fires", 1, 2),
}


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small recorded run of steps 0-5 with a checkpoint at every step, shared by the tests here."""
    out = tmp_path_factory.mktemp("executions") / "golden"
    record_run(small_config("run.steps=6", "run.checkpoint_every=1"), out, node_label="golden", progress=False)
    return out


@pytest.fixture
def profiles(tmp_path: Path) -> dict[str, str]:
    """The profiles by name: shipped ones as they are, BURST and RARE as files."""
    for name, text in (("burst", BURST), ("rare", RARE)):
        (tmp_path / f"{name}.toml").write_text(text, encoding="utf-8")
    return {
        "bursty-mismatch": "bursty-mismatch",
        "burst": str(tmp_path / "burst.toml"),
        "rare": str(tmp_path / "rare.toml"),
    }


def log_events(run: Path) -> list[tuple[str, int, dict]]:
    return [(r.kind, r.step, r.fields) for r in LogReader(rank_dir(run, 0)).records() if isinstance(r, EventRecord)]


@pytest.mark.slow
def test_each_kind_of_step_runs_as_often_as_it_must(golden: Path, profiles: dict[str, str], tmp_path: Path) -> None:
    suspect = suspect_from_profile(profiles["burst"])
    forwards = 0

    def count(module: torch.nn.Module, args: object) -> None:
        nonlocal forwards
        forwards += isinstance(module, Transformer)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        for column, mode in enumerate(MODES, start=1):
            # One step per replay, from the checkpoint at that step: the hook's count is that step's alone.
            for step, expected in EXPECTED.items():
                forwards = 0
                out = tmp_path / f"{mode}-{step}"
                summary = Replayer(
                    ReplayRequest(golden, out, parse_steps(str(step)), suspect, mode=mode, progress=False)
                ).run()
                what, want = expected[0], expected[column]
                assert forwards == want * MICROBATCHES, (mode, what)
                assert [r.executions for r in summary.steps] == [want], (mode, what)
                fired = summary.steps[0].faults > 0
                assert fired == what.startswith("faulty"), (mode, what)
            # All four in one replay: no step's count depends on the step before.
            forwards = 0
            summary = Replayer(
                ReplayRequest(golden, tmp_path / f"{mode}-all", parse_steps("2:6"), suspect, mode=mode, progress=False)
            ).run()
            want = [e[column] for e in EXPECTED.values()]
            assert [r.executions for r in summary.steps] == want, mode
            assert forwards == sum(want) * MICROBATCHES, mode
    finally:
        handle.remove()


@pytest.mark.slow
def test_lockstep_tries_armed_steps_first_once_they_are_mostly_clean(
    golden: Path, profiles: dict[str, str], tmp_path: Path
) -> None:
    """A node armed on every step with rare faults: lockstep's first armed step runs golden + suspect (2); clean,
    it lets the next armed steps try first (1 each), and the faulty step 5 pays the trial (3). Param-sync always
    tries first: 1 per clean step, 2 for the faulty one."""
    suspect = suspect_from_profile(profiles["rare"])
    for mode, want in (("lockstep", [2, 1, 1, 3]), ("param-sync", [1, 1, 1, 2])):
        summary = Replayer(
            ReplayRequest(golden, tmp_path / mode, parse_steps("2:6"), suspect, mode=mode, progress=False)
        ).run()
        assert [r.executions for r in summary.steps] == want, mode
        assert [r.faults > 0 for r in summary.steps] == [False, False, False, True], mode


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("profile", ["bursty-mismatch", "burst", "rare"])
def test_the_shortcuts_write_the_log_of_golden_plus_suspect(
    golden: Path, profiles: dict[str, str], tmp_path: Path, mode: str, profile: str
) -> None:
    # bursty-mismatch with fault seed 2 (benchmarks/bench_replay.py's node) fires in steps 2-4 of 1-4: a clean step,
    # a burst's first step and two later ones; `burst` adds an armed step in which nothing fires, `rare` the trials
    # of lockstep.
    suspect = suspect_from_profile(profiles[profile], fault_seed=2)
    steps = "1:5" if profile == "bursty-mismatch" else "2:6"
    logs, executions = [], []
    for shortcuts in (True, False):
        out = tmp_path / f"{mode}-{shortcuts}"
        summary = Replayer(
            ReplayRequest(golden, out, parse_steps(steps), suspect, mode=mode, progress=False), shortcuts=shortcuts
        ).run()
        logs.append(log_events(out))
        executions.append(sum(r.executions for r in summary.steps))
    fast, full = logs
    assert any(kind == "fault" for kind, _, _ in full) and any(
        kind == "replay_step" and f["faults"] == 0 for kind, _, f in full
    )
    assert [(k, s) for k, s, _ in fast] == [(k, s) for k, s, _ in full]
    assert repr(fast) == repr(full)  # every field, floats bit for bit (-0.0, nan)
    assert executions[0] < executions[1] == 2 * 4


@pytest.mark.slow
def test_a_faulty_param_sync_step_runs_once_with_captured_golden_gradients(
    profiles: dict[str, str], tmp_path: Path
) -> None:
    """With every parameter gradient of the replayed steps captured (`--capture-steps`), a faulty param-sync step
    runs once: the trial is the suspect's step, and the golden update takes the captured gradients, its parameters
    checked against the golden log. The replay log is the one golden + suspect on every step writes."""
    golden = tmp_path / "captured"
    capture = TraceOptions(capture=CapturePolicy(steps=frozenset(range(2, 6))))
    record_run(
        small_config("run.steps=6", "run.checkpoint_every=2"),
        golden,
        node_label="golden",
        progress=False,
        trace=capture,
    )
    suspect = suspect_from_profile(profiles["burst"])
    logs = []
    for shortcuts in (True, False):
        out = tmp_path / f"sync-{shortcuts}"
        summary = Replayer(
            ReplayRequest(
                golden, out, parse_steps("2:6"), suspect, mode="param-sync", golden_from="blobs", progress=False
            ),
            shortcuts=shortcuts,
        ).run()
        logs.append(log_events(out))
        if shortcuts:
            assert [r.executions for r in summary.steps] == [1, 1, 1, 1]
            assert [r.faults > 0 for r in summary.steps] == [False, True, True, False]
    assert any(kind == "grad_noise" and f["name"] == "*" and f["ratio"] > 0 for kind, _, f in logs[1])
    assert repr(logs[0]) == repr(logs[1])
