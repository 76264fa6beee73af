"""Default sites found by structure (every block's attention and feed-forward, whatever they are called), the
sites said once at start, faults outside every site warned of, and wrapper prefixes (DDP's ``module.``) left out
of names so that a wrapped and an unwrapped run pair."""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from faults import load_profile
from faults.emulator import FaultEmulator
from faults.node import emulated_node, node_header
from tests.support import diff_first_divergence, events
from tests.tracer.test_user_models import lm_loss, train
from tests.tracer.user_models import tiny_gpt, tiny_hf_gpt2, tiny_llama
from tracer import sites as tracer_sites
from tracer.compare import compare_runs
from tracer.errors import TraceWarning
from tracer.log import LogReader, rank_dir
from tracer.log.records import TensorRecord
from tracer.options import RunInfo, TraceOptions
from tracer.pairing import pairing_differences
from tracer.sites import describe_sites, find_sites, named_modules, named_parameters
from tracer.tracing import Tracer

VOCAB, SEQ = 64, 8


def tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=SEQ,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    )


def tiny_t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    return T5ForConditionalGeneration(
        T5Config(
            vocab_size=VOCAB,
            d_model=16,
            d_kv=4,
            d_ff=32,
            num_layers=2,
            num_heads=2,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
        )
    )


def sites(model: nn.Module) -> list[str]:
    return [n for n, _ in find_sites(model)]


def test_bert_blocks_give_their_attention_and_both_feed_forward_parts() -> None:
    assert sites(tiny_bert()) == [
        f"bert.encoder.layer.{i}.{part}" for i in range(2) for part in ("attention", "intermediate", "output")
    ]


def test_t5_blocks_give_their_attention_and_feed_forward_layers_by_structure() -> None:
    assert sites(tiny_t5()) == [
        *(f"encoder.block.{i}.layer.{part}" for i in range(2) for part in (0, 1)),  # self-attention, T5LayerFF
        *(f"decoder.block.{i}.layer.{part}" for i in range(2) for part in (0, 1, 2)),  # self, cross, T5LayerFF
    ]


def test_torch_transformer_layers_give_self_and_cross_attention_and_linear1_2() -> None:
    model = nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=32, batch_first=True
    )
    assert sites(model) == [
        *(f"encoder.layers.{i}.{part}" for i in range(2) for part in ("self_attn", "linear1", "linear2")),
        *(f"decoder.layers.0.{part}" for part in ("self_attn", "multihead_attn", "linear1", "linear2")),
    ]
    assert describe_sites(sites(model)) == [
        "encoder.layers.{0..1}.{self_attn,linear1,linear2}",
        "decoder.layers.0.{self_attn,multihead_attn,linear1,linear2}",
    ]


def test_blocks_in_a_module_dict_give_their_attention_and_their_mixture_of_experts() -> None:
    """torchtitan keeps its layers in an ``nn.ModuleDict`` (``layers.0``) and calls a MoE layer's feed-forward
    ``moe``, which no name pattern matches: found by structure, as in a list of blocks."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.attention = nn.LayerNorm(8), nn.MultiheadAttention(8, 2)
            self.ffn_norm, self.moe = nn.LayerNorm(8), nn.Sequential(nn.Linear(8, 8))

    model = nn.Module()
    model.layers = nn.ModuleDict({str(i): Block() for i in range(2)})
    assert sites(model) == [f"layers.{i}.{part}" for i in range(2) for part in ("attention", "moe")]


def test_models_named_the_usual_way_keep_their_sites() -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    from workload.reference import build
    from workload.reference_config import Config

    blocks = [("h.", "attn", "mlp"), ("model.layers.", "self_attn", "mlp")]
    for model, (prefix, attention, mlp) in zip((tiny_gpt(), tiny_llama()), blocks):
        assert sites(model) == [f"{prefix}{i}.{part}" for i in range(2) for part in (attention, mlp)]
    assert sites(tiny_hf_gpt2()) == [f"transformer.h.{i}.{part}" for i in range(2) for part in ("attn", "mlp")]
    mixtral = MixtralForCausalLM(
        MixtralConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=32,
            num_local_experts=2,
        )
    )
    assert sites(mixtral) == [f"model.layers.{i}.{part}" for i in range(2) for part in ("self_attn", "mlp")]
    reference = build(Config.from_dict({"model": {"n_layers": 2}})).model
    assert sites(reference) == [f"layers.{i}.{part}" for i in range(2) for part in ("attention", "feed_forward")]


def test_the_sites_are_said_once_at_start_in_a_few_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 32, enable_nested_tensor=False
    )
    with Tracer(model, None, out=tmp_path / "run", run=RunInfo("x")):
        pass
    err = capsys.readouterr().err
    assert err.count("sdctrace: tracing 96 sites (the defaults") == 1
    assert err.splitlines()[-1] == "  layers.{0..31}.{self_attn,linear1,linear2}"
    said: list[str] = []
    with Tracer(model, None, out=tmp_path / "quiet", run=RunInfo("x"), echo=None):
        pass
    with Tracer(model, None, out=tmp_path / "told", run=RunInfo("x"), echo=said.append):
        pass
    assert capsys.readouterr().err == "" and len(said) == 1 and said[0].count("\n") == 1


def bert_profile(tmp_path: Path, module: str, step: int = 1):  # noqa: ANN201
    path = tmp_path / "ffn.toml"
    path.write_text(
        f'seed = 7\n[[fault]]\nops = ["matmul"]\nsites = "{module.replace(".", "[.]")}"\n'
        f'phases = ["forward"]\nsteps = [{step}]\nelements = 4\nkind = "scale"\nfactor = 8.0\n'
    )
    return load_profile(path)


def record_bert(out: Path, profile=None, steps: int = 2, make=tiny_bert) -> Path:  # noqa: ANN001
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    run = RunInfo(out.name, config={"model": "tiny-bert"}, extra=node_header(profile, 0, False))
    with Tracer(model, opt, out=out, run=run) as tr:
        node = emulated_node(tr, model, fault_profile=profile) if profile is not None else contextlib.nullcontext()
        with node:
            for step in range(steps):
                with tr.step(step):
                    ids = torch.randint(0, VOCAB, (2, SEQ), generator=data)
                    tr.microbatch(0, inputs=ids)
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    tr.loss(loss)
                    opt.step()
                    opt.zero_grad()
    return out


@pytest.mark.slow
def test_a_fault_in_berts_first_feed_forward_is_the_first_divergence_there(tmp_path: Path) -> None:
    site = "bert.encoder.layer.0.intermediate"
    golden = record_bert(tmp_path / "golden")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)  # the faulted module is traced: nothing to warn of
        sick = record_bert(tmp_path / "sick", bert_profile(tmp_path, site))
    assert {(f.step, f.fields["site"]) for f in events(sick, "fault")} == {(1, site)}
    assert diff_first_divergence(golden, sick, tmp_path / "study.duckdb") == [(1, 0, "forward", site, "differ")]


@pytest.mark.slow
def test_a_fault_in_t5s_first_encoder_feed_forward_is_the_first_divergence_there(tmp_path: Path) -> None:
    site = "encoder.block.0.layer.1"  # a T5LayerFF: found by structure, no name or class says feed-forward
    golden = record_bert(tmp_path / "golden", make=tiny_t5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)  # the faulted module is traced: nothing to warn of
        sick = record_bert(tmp_path / "sick", bert_profile(tmp_path, site), make=tiny_t5)
    assert {(f.step, f.fields["site"]) for f in events(sick, "fault")} == {(1, site)}
    assert diff_first_divergence(golden, sick, tmp_path / "study.duckdb") == [(1, 0, "forward", site, "differ")]


def test_a_fault_in_a_module_no_site_holds_is_warned_of_once_by_name(tmp_path: Path) -> None:
    model = tiny_bert()
    profile = bert_profile(tmp_path, "bert.encoder.layer.0.intermediate", step=0)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    emulator = FaultEmulator(
        profile,
        model,
        clock=lambda: (0, 0),
        sink=lambda k, f: None,
        sites=tuple(f"bert.encoder.layer.{i}.attention" for i in range(2)),
    )
    with pytest.warns(
        TraceWarning,
        match=r"in module bert\.encoder\.layer\.0\.intermediate, which no traced site "
        r"holds.*TraceOptions\(sites=\.\.\.\) or sdc record --sites",
    ) as caught:
        with emulator:
            model(input_ids=ids)
            model(input_ids=ids)
    assert len([w for w in caught if issubclass(w.category, TraceWarning)]) == 1


@contextlib.contextmanager
def one_rank_group(tmp_path: Path):  # noqa: ANN201
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ddp_names_leave_out_its_module_only_at_the_top(tmp_path: Path) -> None:
    class Holder(nn.Module):  # a user's own submodule named `module`
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)

    model = nn.Sequential(Holder())
    with one_rank_group(tmp_path):
        wrapped = nn.parallel.DistributedDataParallel(model)
        assert [n for n, _ in named_modules(wrapped)] == ["0", "0.module"] == [n for n, _ in named_modules(model)]
        assert [n for n, _ in named_parameters(wrapped)] == ["0.module.weight", "0.module.bias"]


@pytest.mark.slow
def test_a_ddp_run_pairs_with_the_unwrapped_one_and_says_what_it_left_out(tmp_path: Path) -> None:
    plain = train(tiny_gpt(), lm_loss, tmp_path / "plain")
    with one_rank_group(tmp_path):
        ddp = train(nn.parallel.DistributedDataParallel(tiny_gpt()), lm_loss, tmp_path / "ddp")
    a, b = LogReader(rank_dir(plain, 0)).header, LogReader(rank_dir(ddp, 0)).header
    assert b.extra["wrappers"] == ["module"] and "wrappers" not in a.extra
    assert b.extra["sites"] == a.extra["sites"] == [f"h.{i}.{p}" for i in range(2) for p in ("attn", "mlp")]
    assert pairing_differences(a, b) == []
    names = [
        {r.name for r in LogReader(rank_dir(run, 0)).records() if isinstance(r, TensorRecord)} for run in (plain, ddp)
    ]
    assert names[0] == names[1] and not any(n.startswith("module.") for n in names[1])
    assert compare_runs(plain, ddp).first is None  # one rank's all-reduce changes no bit


def test_a_ddp_checkpoint_restores_into_the_model_unwrapped_and_back(tmp_path: Path) -> None:
    from tracer.checkpoint import load_checkpoint, save_checkpoint

    with one_rank_group(tmp_path):
        ddp = nn.parallel.DistributedDataParallel(tiny_gpt())
        save_checkpoint(tmp_path / "run", 0, 0, ddp, None, {})
        checkpoint = load_checkpoint(tmp_path / "run", 0)
        assert set(checkpoint.model) == set(tiny_gpt().state_dict())
        plain = tiny_gpt()
        with torch.no_grad():
            for p in plain.parameters():
                p.zero_()
        checkpoint.restore(plain)
        assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), ddp.module.state_dict().values()))
        checkpoint.restore(ddp)


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_fsdp_units_around_each_layer_keep_the_names_and_sites_of_the_model(tmp_path: Path) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.bert.modeling_bert import BertLayer

    with one_rank_group(tmp_path):
        wrapped = FullyShardedDataParallel(
            tiny_bert(),
            device_id=torch.device("cpu"),
            use_orig_params=True,
            auto_wrap_policy=ModuleWrapPolicy({BertLayer}),
        )
        assert sites(wrapped) == sites(tiny_bert())
        assert [n for n, _ in named_parameters(wrapped)] == [n for n, _ in tiny_bert().named_parameters()]
        assert [n for n, _ in find_sites(wrapped, r"bert\.encoder\.layer\.\d+")] == [
            "bert.encoder.layer.0",
            "bert.encoder.layer.1",
        ]  # the FSDP unit, once, not also the layer it wraps


@pytest.mark.parametrize("spec", [None, r"bert\.encoder\.layer\.\d+\.(attention|output)|cls"])
def test_a_tracer_with_an_emulated_node_and_abft_matches_its_sites_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str | None
) -> None:
    """The Tracer matches the sites (the defaults, or its regex) and the emulator and checker take the names: one
    match per model. A fault in a site the regex adds to the defaults (``cls``) is in a traced site."""
    matches: list[str | None] = []

    def counting(function):  # noqa: ANN001, ANN202
        def call(pattern, *args, **kwargs):  # noqa: ANN001, ANN202
            if pattern == spec:
                matches.append(pattern)
            return function(pattern, *args, **kwargs)

        return call

    for name in ("compile", "fullmatch", "match", "search"):
        monkeypatch.setattr(re, name, counting(getattr(re, name)))
    defaults = tracer_sites.default_sites
    monkeypatch.setattr(tracer_sites, "default_sites", lambda named: matches.append(None) or defaults(named))
    model = tiny_bert()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    site = "cls" if spec else "bert.encoder.layer.1.intermediate"
    profile = bert_profile(tmp_path, site, step=0)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with (
        warnings.catch_warnings(),
        Tracer(model, opt, out=tmp_path / "run", run=RunInfo("x"), options=TraceOptions(sites=spec), echo=None) as tr,
        emulated_node(tr, model, fault_profile=profile, abft=True),
    ):
        warnings.simplefilter("error", TraceWarning)  # the faulted module is traced: nothing to warn of
        with tr.step(0):
            tr.microbatch(0, inputs=ids)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    assert matches == [spec]
    assert {f.fields["site"] for f in events(tmp_path / "run", "fault")} == {site}
    assert {f.fields["site"] for f in events(tmp_path / "run", "abft")} >= {site}
