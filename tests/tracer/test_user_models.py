"""The Tracer on models as users write them: every site records a forward and a backward fingerprint,
and two identical runs record identical fingerprints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.tracer.user_models import SEQ, VOCAB, tiny_gpt, tiny_hf_gpt2, tiny_llama, tiny_llama_config, tiny_sequential
from tracer.compare import compare_runs
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord
from tracer.options import RunInfo, TraceOptions
from tracer.summary import summarize_run
from tracer.tracing import Tracer

STEPS, MICROBATCHES = 2, 2

Batch = Callable[[nn.Module, torch.Generator], tuple[torch.Tensor, torch.Tensor]]  # -> (inputs, loss)


def hf_lm_loss(model: nn.Module, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    return tokens, model(input_ids=tokens, labels=tokens).loss


def lm_loss(model: nn.Module, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    logits = model(tokens)  # (B, T, V)
    return tokens, F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def regression_loss(model: nn.Module, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(4, 8, generator=g)
    return x, (model(x) - x.flip(-1)).pow(2).mean()


def train(model: nn.Module, batch: Batch, out: Path, steps: int = STEPS, config: dict | None = None, **options) -> Path:
    """A plain loop of our own: ``steps`` optimizer steps of MICROBATCHES accumulated microbatches."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)
    run = RunInfo(out.name, config=config if config is not None else {"microbatches": MICROBATCHES})
    with Tracer(model, opt, out=out, run=run, options=TraceOptions(**options)) as tr:
        for step in range(steps):
            with tr.step(step):
                for mb in range(MICROBATCHES):
                    inputs, loss = batch(model, data)
                    tr.microbatch(mb, inputs=inputs)
                    (loss / MICROBATCHES).backward()
                    tr.loss(loss / MICROBATCHES)
                opt.step()
                opt.zero_grad()
    return out


def blocks(prefix: str, attn: str) -> list[str]:
    return [f"{prefix}{i}.{site}" for i in range(2) for site in (attn, "mlp")]


MODELS = {  # name: (model, batch and loss, trace options, its sites)
    "hf-llama": (tiny_llama, hf_lm_loss, {}, blocks("model.layers.", "self_attn")),
    "hf-gpt2": (tiny_hf_gpt2, hf_lm_loss, {}, blocks("transformer.h.", "attn")),
    "gpt2-style": (tiny_gpt, lm_loss, {}, blocks("h.", "attn")),
    "sequential": (tiny_sequential, regression_loss, {"sites": r"0|2"}, ["0", "2"]),
}


@pytest.mark.filterwarnings("error::tracer.errors.TraceWarning")
@pytest.mark.parametrize("name", list(MODELS))
def test_every_site_records_forward_and_backward_and_identical_runs_agree(name: str, tmp_path: Path) -> None:
    make, batch, options, sites = MODELS[name]
    a = train(make(), batch, tmp_path / "a", **options)
    b = train(make(), batch, tmp_path / "b", **options)
    (summary,) = summarize_run(a)
    assert summary.sites == sites and summary.header.extra["sites"] == sites
    per_pass = STEPS * MICROBATCHES * len(sites)
    assert summary.tensors["forward"] == summary.tensors["backward"] == per_pass
    assert "sites_without_backward" not in summary.header.extra
    records = [r for r in LogReader(rank_dir(a, 0)).records() if isinstance(r, TensorRecord)]
    # Each microbatch is labelled as such, and backward visits the sites in reverse.
    by_mb = Counter((r.step, r.microbatch) for r in records if r.phase == Phase.BACKWARD)
    assert by_mb == {(s, mb): len(sites) for s in range(STEPS) for mb in range(MICROBATCHES)}
    bwd = [r.name for r in records if (r.step, r.microbatch, r.phase) == (1, 1, Phase.BACKWARD)]
    assert bwd == sites[::-1]
    result = compare_runs(a, b)
    assert result.first is None and result.events == len(records)


def test_a_site_that_cannot_record_a_gradient_is_named_once_on_stderr_and_in_the_header(tmp_path: Path) -> None:
    from tracer.errors import TraceWarning

    model = tiny_gpt()
    with pytest.warns(TraceWarning) as caught:
        run = train(model, lm_loss, tmp_path / "run", sites=[model.wte, model.h[0].mlp])
    assert [str(w.message) for w in caught] == [
        (
            "site wte records no backward (gradient) fingerprint: it has no floating-point tensor input (positional "
            "or keyword); choose sites whose input is a floating-point tensor (TraceOptions(sites=...)) to record one"
        )
    ]
    (summary,) = summarize_run(run)
    assert summary.header.extra["sites_without_backward"] == {
        "wte": "it has no floating-point tensor input (positional or keyword)"
    }
    assert summary.tensors["forward"] == 2 * summary.tensors["backward"]


def test_a_step_with_more_backward_passes_than_microbatch_calls_warns_once(tmp_path: Path) -> None:
    from tracer.errors import TraceWarning

    model = tiny_gpt()
    data = torch.Generator().manual_seed(1)
    with pytest.warns(TraceWarning, match=r"second backward pass began without tracer.microbatch\(\)") as caught:
        with Tracer(model, None, out=tmp_path / "run", run=RunInfo("x")) as tr:
            for step in range(2):
                with tr.step(step):
                    tr.microbatch(0)
                    for _ in range(3):  # three microbatches, one microbatch() call
                        lm_loss(model, data)[1].backward()
    assert len(caught) == 1 and str(caught[0].message).startswith("step 0:")


@pytest.mark.filterwarnings("error::tracer.errors.TraceWarning")
@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_is_not_taken_for_another_microbatch(tmp_path: Path, reentrant: bool) -> None:
    from torch.utils.checkpoint import checkpoint

    model = tiny_gpt()
    for block in model.h:
        block.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=reentrant))(block.forward)
    data = torch.Generator().manual_seed(1)
    with Tracer(model, None, out=tmp_path / "run", run=RunInfo("x")) as tr, tr.step(0):
        for mb in range(2):
            tr.microbatch(mb)
            lm_loss(model, data)[1].backward()
    backward = [r for r in tensor_records(tmp_path / "run") if r.phase == Phase.BACKWARD]
    assert Counter(r.microbatch for r in backward) == {0: 4, 1: 4}


def tensor_records(run: Path) -> list[TensorRecord]:
    return [r for r in LogReader(rank_dir(run, 0)).records() if isinstance(r, TensorRecord)]


def test_a_hugging_face_config_dict_is_the_run_config_and_its_fingerprint_is_stable(tmp_path: Path) -> None:
    from tracer.config_fingerprint import config_fingerprint, header_config
    from tracer.pairing import pairing_differences

    config = tiny_llama_config().to_dict()
    assert 0 in config["id2label"]  # integer keys: not storable as they are
    a = train(tiny_llama(), hf_lm_loss, tmp_path / "a", steps=1, config=config)
    b = train(tiny_llama(), hf_lm_loss, tmp_path / "b", steps=1, config=tiny_llama_config().to_dict())
    ha, hb = (LogReader(rank_dir(run, 0)).header for run in (a, b))
    assert ha.config["id2label"] == {"0": "no", "1": "yes"} and ha.config["hidden_size"] == 16
    assert ha.config_fingerprint == hb.config_fingerprint == config_fingerprint(header_config(config))
    assert pairing_differences(ha, hb) == [] and compare_runs(a, b).first is None
