"""The README's "Tracing your own training loop" example runs as written, on a model of its shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tracer.summary import summarize_run

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> str:
    section = README.read_text(encoding="utf-8").split("### Tracing your own training loop", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README: no python block under 'Tracing your own training loop'"
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


def test_the_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
    exec(compile(example(), str(README), "exec"), namespace)
    (summary,) = summarize_run(tmp_path / "runs" / "node-7")
    assert summary.status.complete and summary.checkpoints == [0]
    assert summary.sites == ["blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp"]
    assert summary.tensors["forward"] == summary.tensors["backward"] == 3 * 2 * 4
