"""Small real runs for the pipeline tests, recorded once per session, and a way to diff them.

- ``golden``: 5 steps; ``twin``: the same config for 4 steps (a healthy pair of different length);
- ``hooked``: like golden, but a forward hook registered before tracing perturbs
  ``FAULT_SITE``'s output at ``FAULT_STEP``, microbatch ``FAULT_MICROBATCH``;
- ``emulated``: the fault emulator flips one exponent bit in ``layers.1.feed_forward`` at
  step 3, with ABFT on, against ``abft_golden`` (ABFT on, no faults);
- ``replay``: a replay log of golden, written with LogWriter per the documented event schema.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from faults import load_profile
from jobs.record import record_run
from pipelines.arguments import DiffRequest
from pipelines.run import DiffReport, diff
from tests.support import ONE_FLIP, made_once, small_config
from tracer.log import EventRecord, LogReader, LogWriter, rank_dir
from tracer.options import RunInfo
from tracer.tracing import Tracer
from workload.protocol import run_step
from workload.reference import build
from workload.reference_config import Config

FAULT_STEP, FAULT_MICROBATCH, FAULT_SITE = 2, 1, "layers.1.attention"
IN_MEMORY = ["--direct_running_mode=in_memory"]

SITE_MISMATCH = [  # (step, microbatch, site, phase, elements, mismatched, severity)
    (1, 0, "layers.0.attention", "forward", 4096, 0, None),
    (1, 0, "layers.1.feed_forward", "forward", 4096, 17, 0.25),
    (2, 1, "layers.1.feed_forward", "backward", 4096, 3, 1.5),
]
GRAD_NOISE = [(1, "*", 0.02, 4.0), (1, "layers.0.attention.wq.weight", 0.01, 1.0), (2, "*", 0.0, 4.1)]


def record_hooked(cfg: Config, out: Path) -> None:
    """Record like `record_run`, with FAULT_SITE's output perturbed once, before the Tracer sees it."""
    w = build(cfg)
    site = dict(w.model.named_modules())[FAULT_SITE]
    run = RunInfo("hooked", config=cfg.to_dict(), seed=cfg.train.seed, data_order_fingerprint=w.data.fingerprint)
    tracer = Tracer(w.model, w.optimizer, out=out, run=run)

    def perturb(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if (tracer.step_index, tracer.microbatch_index) == (FAULT_STEP, FAULT_MICROBATCH):
            return output * 1.001
        return None

    handle = site.register_forward_hook(perturb)  # first: the Tracer's own hook then sees the perturbed output
    try:
        with tracer:
            for step in range(cfg.run.steps):
                if step % cfg.run.checkpoint_every == 0:
                    tracer.checkpoint(step, data={"step": step})
                with tracer.step(step):
                    run_step(w, step, tracer)
            tracer.checkpoint(cfg.run.steps, data={"step": cfg.run.steps})
    finally:
        handle.remove()


def write_replay(golden: Path, out: Path) -> None:
    header = dataclasses.replace(LogReader(rank_dir(golden, 0)).header, run_id="replay-0001", role="replay")
    with LogWriter(rank_dir(out, 0), header) as w:
        for step, mb, site, phase, elements, mismatched, severity in SITE_MISMATCH:
            w.write_event(
                EventRecord(
                    "site_mismatch",
                    step,
                    {
                        "microbatch": mb,
                        "site": site,
                        "phase": phase,
                        "elements": elements,
                        "mismatched": mismatched,
                        "frequency": mismatched / elements,
                        "severity": severity,
                        "max_rel": (severity or 0.0) * 2,
                    },
                )
            )
        for step, name, diff_l2, golden_l2 in GRAD_NOISE:
            w.write_event(
                EventRecord(
                    "grad_noise",
                    step,
                    {
                        "name": name,
                        "diff_l2": diff_l2,
                        "golden_l2": golden_l2,
                        "ratio": diff_l2 / golden_l2,
                    },
                )
            )


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    def make(root: Path) -> None:
        cfg = small_config("run.steps=5")
        record_run(cfg, root / "golden", node_label="golden", progress=False)
        record_run(small_config("run.steps=4"), root / "twin", node_label="twin", progress=False)
        record_hooked(cfg, root / "hooked")
        write_replay(root / "golden", root / "replay")

    root = made_once(tmp_path_factory, "pipeline-runs", make)
    return {name: root / name for name in ("golden", "twin", "hooked", "replay")}


@pytest.fixture(scope="session")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    def make(root: Path) -> None:
        (root / "one-flip.toml").write_text(ONE_FLIP, encoding="utf-8")
        cfg = small_config("run.steps=5")
        record_run(cfg, root / "golden", node_label="golden", progress=False, abft=True)
        profile = load_profile(root / "one-flip.toml")
        record_run(cfg, root / "suspect", node_label="suspect", progress=False, abft=True, fault_profile=profile)

    root = made_once(tmp_path_factory, "emulated", make)
    return {"golden": root / "golden", "suspect": root / "suspect"}


@pytest.fixture
def run_diff(tmp_path: Path) -> Callable[..., tuple[DiffReport, list[str]]]:
    """Diff two runs into ``tmp_path/study.duckdb`` (or `db`): (report, progress lines). Keyword options are
    `DiffRequest`'s."""

    def run(
        golden: Path, suspect: Path, *, beam: list[str] = IN_MEMORY, db: Path | None = None, **options: object
    ) -> tuple[DiffReport, list[str]]:
        request = DiffRequest(
            golden=str(golden),
            suspect=str(suspect),
            db=db or tmp_path / "study.duckdb",
            beam_args=tuple(beam),
            **options,
        )
        lines: list[str] = []
        return diff(request, echo=lines.append), lines

    return run


def flipped_copy(run: Path, out: Path) -> Path:
    """A copy of `run` with one bit flipped in the middle of rank 0's first segment."""
    shutil.copytree(run, out)
    seg = rank_dir(out, 0) / "000000.sdclog"
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0x10
    seg.write_bytes(bytes(data))
    return seg
