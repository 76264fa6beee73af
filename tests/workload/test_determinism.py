"""Bit-for-bit reproducibility of init and training, forward and backward, on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tracer.determinism import configure_determinism
from workload.data import TokenData
from workload.model import Transformer
from workload.reference_config import Config, load_config


@pytest.fixture(autouse=True)
def restore_global_settings():
    """configure_determinism changes process-wide state; give it back to other tests."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def init(cfg: Config) -> Transformer:
    configure_determinism(cfg.train.seed, cfg.train.threads)
    model = Transformer(cfg.model)
    model.init_weights(torch.Generator().manual_seed(cfg.train.seed))
    return model


def train(cfg: Config, steps: int) -> dict[str, torch.Tensor]:
    """A minimal training loop: microbatch accumulation, grad clipping, AdamW, schedule."""
    model = init(cfg)
    data = TokenData(cfg.data)
    o = cfg.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = o.lr_at(step)
        for microbatch in range(cfg.data.microbatches):
            inputs, targets = data.batch(step, microbatch)
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            (loss / cfg.data.microbatches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differing = [name for name in a if not torch.equal(a[name], b[name])]
    assert not differing, f"parameters differ: {differing}"


def small() -> Config:
    cfg = load_config("tiny", ["data.batch_size=4", "data.seq_len=32"])
    assert cfg.data.microbatches > 1 and cfg.optim.name == "adamw"
    return cfg


def test_init_is_bit_identical_and_seeded():
    cfg = small()
    first = dict(init(cfg).state_dict())
    assert torch.are_deterministic_algorithms_enabled()
    assert_bit_identical(first, dict(init(cfg).state_dict()))
    other = dict(init(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=1))).state_dict())
    assert not torch.equal(first["layers.0.attention.wq.weight"], other["layers.0.attention.wq.weight"])


def test_training_is_bit_identical_and_seeded():
    cfg = small()
    first = train(cfg, steps=3)
    assert_bit_identical(first, train(cfg, steps=3))
    assert not torch.equal(first["output.weight"], init(cfg).output.weight.detach())  # it trained
    reseeded = train(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=1)), steps=3)
    assert not torch.equal(first["output.weight"], reseeded["output.weight"])
