"""The README as a newcomer meets it: at most 220 lines; its step 1 loop runs as written on a model of its shape; and
every shell block marked `<!-- runs -->` runs, in order, in one fresh folder, against the real CLI, printing the
lines its `<!-- prints -->` block after it claims."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tracer.summary import summarize_run

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 220


@dataclass(frozen=True)
class Runnable:
    """One runnable shell block and the lines the README says it prints (each a substring of its output)."""

    line: int
    code: str
    prints: tuple[str, ...]


def runnable_blocks(text: str) -> list[Runnable]:
    """`<!-- runs -->` then a ```sh block; a `<!-- prints -->` ```text block before the next runnable one is its."""
    fenced = r"\n```(\w+)\n(.*?)\n```"
    blocks: list[Runnable] = []
    for match in re.finditer(r"<!-- (runs|prints) -->" + fenced, text, re.S):
        marker, language, body = match.groups()
        line = text.count("\n", 0, match.start()) + 1
        if marker == "runs":
            assert language == "sh", f"README line {line}: <!-- runs --> marks a {language} block, not sh"
            blocks.append(Runnable(line, body, ()))
        else:
            assert language == "text" and blocks, f"README line {line}: <!-- prints --> needs a text block after one"
            last = blocks[-1]
            assert not last.prints, f"README line {line}: a second <!-- prints --> for the block at line {last.line}"
            blocks[-1] = Runnable(last.line, last.code, tuple(body.splitlines()))
    return blocks


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines, at most {MAX_LINES}: move the detail to docs/"


def test_every_marker_marks_a_block() -> None:
    text = README.read_text(encoding="utf-8")
    blocks = runnable_blocks(text)
    assert len(blocks) == text.count("<!-- runs -->") >= 4
    assert sum(bool(b.prints) for b in blocks) == text.count("<!-- prints -->")


def loop_example() -> str:
    section = README.read_text(encoding="utf-8").split("### 1. Trace your loop", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: no python block under '1. Trace your loop'"
    return match.group(1)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def test_the_loop_of_step_1_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Net()
    data = torch.Generator().manual_seed(1)
    batches = [
        [(torch.randn(4, 8, generator=data), torch.randn(4, 8, generator=data)) for _ in range(2)] for _ in range(3)
    ]
    namespace = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "cfg_dict": {"dim": 8},
        "seed": 0,
        "steps": 3,
        "loader_position": 0,
        "microbatches": lambda step: batches[step],
        "loss_fn": F.mse_loss,
        "n_micro": 2,
    }
    monkeypatch.chdir(tmp_path)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        exec(compile(loop_example(), str(README), "exec"), namespace)
    finally:  # the example configures this process; the tests after it get theirs back
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    (summary,) = summarize_run(tmp_path / "runs" / "node-7")
    assert summary.status.complete and summary.checkpoints == [0]
    assert summary.sites == ["blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp"]
    assert summary.tensors["forward"] == summary.tensors["backward"] == 3 * 2 * 4


def shims(folder: Path) -> Path:
    """`sdc` and `python` as a user's activated venv has them, but running this checkout (PYTHONPATH)."""
    folder.mkdir()
    for name, argv in [("sdc", f"{sys.executable} -m sdc.cli"), ("python", sys.executable)]:
        (folder / name).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (folder / name).chmod(0o755)
    return folder


@pytest.mark.slow
def test_the_runnable_blocks_run_and_print_what_they_say(tmp_path: Path) -> None:
    bin_dir, work = shims(tmp_path / "bin"), tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    for block in runnable_blocks(README.read_text(encoding="utf-8")):
        done = subprocess.run(
            ["bash", "-eu", "-c", block.code], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"README line {block.line}: exit {done.returncode}\n{out}"
        missing = [line for line in block.prints if line not in out]
        assert not missing, f"README line {block.line}: does not print {missing}\n{out}"
