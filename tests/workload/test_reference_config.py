"""Config loading: defaults, shipped files, overrides, one-line errors, fingerprint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tracer.config_fingerprint import config_fingerprint
from tracer.errors import ConfigError
from workload.reference_config import Config, load_config, shipped_configs


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my.toml"
    path.write_text(text)
    return path


def config_error(spec, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(spec, overrides)
    message = str(info.value)
    assert "\n" not in message, f"error message spans lines: {message!r}"
    return message


def test_default_is_tiny_and_matches_dataclass_defaults():
    assert load_config() == load_config("tiny") == Config()


def test_shipped_configs_load():
    assert set(shipped_configs()) == {"tiny", "llama3-16l-mini", "llama3-32l-mini"}
    for name in shipped_configs():
        cfg = load_config(name)
        assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("name, layers", [("llama3-16l-mini", 16), ("llama3-32l-mini", 32)])
def test_llama3_minis_keep_llama3_8b_shape(name, layers):
    m = load_config(name).model
    assert m.n_layers == layers
    assert m.n_heads // m.n_kv_heads == 4  # 32 heads / 8 kv heads
    assert m.ffn_hidden == 3.5 * m.dim  # 14336 / 4096
    assert m.rope_theta == 500000.0


def test_missing_keys_take_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "[model]\ndim = 64\n"))
    assert cfg.model.dim == 64
    assert cfg.model.n_layers == Config().model.n_layers
    assert cfg.optim == Config().optim


@pytest.mark.parametrize(
    "text, needles",
    [
        ("[model]\ndimm = 64\n", ["model.dimm", "did you mean model.dim?", "allowed keys in [model]"]),
        ("[modle]\ndim = 64\n", ["[modle]", "did you mean model?", "allowed sections"]),
        ("dim = 64\n", ["unknown section [dim]"]),
        ("model = 3\n", ["[model] must be a table"]),
        ('[model]\ndim = "128"\n', ["model.dim must be an integer, found string '128'", "model.dim = 128"]),
        ("[model]\nnorm_eps = true\n", ["model.norm_eps must be a number, found boolean"]),
        ("[optim]\nbetas = [0.9]\n", ["optim.betas must be an array of 2 numbers"]),
        ('[optim]\nname = "adam"\n', ["optim.name = 'adam' is not one of 'adamw', 'sgd'"]),
        ("[model]\ndim = 130\n", ["model.dim = 130 is not divisible by model.n_heads = 4"]),
        ("[model]\nn_kv_heads = 3\n", ["model.n_heads = 4 is not divisible by model.n_kv_heads = 3"]),
        ("[data]\nseq_len = 512\n", ["data.seq_len = 512 exceeds model.max_seq_len = 128"]),
        ("[data]\nmicrobatches = 0\n", ["data.microbatches = 0 must be >= 1"]),
        ("[optim]\nmin_lr = 1.0\n", ["optim.min_lr = 1.0 must lie in [0, optim.lr"]),
        ("[model]\ndim = = 3\n", ["TOML syntax error", "line 2"]),
    ],
)
def test_bad_file_names_file_and_key(tmp_path, text, needles):
    path = write(tmp_path, text)
    message = config_error(path)
    assert message.startswith(f"{path}: "), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_missing_file_lists_shipped_names(tmp_path):
    message = config_error(tmp_path / "nope.toml")
    assert "nope.toml" in message and "tiny" in message and "llama3-16l-mini" in message


def test_overrides_are_typed():
    cfg = load_config(
        "tiny", ["model.dim=256", "optim.name=sgd", "optim.lr=1", "optim.betas=[0.8, 0.9]", 'model.dtype="bfloat16"']
    )
    assert cfg.model.dim == 256
    assert cfg.optim.name == "sgd"
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.betas == (0.8, 0.9)
    assert cfg.model.dtype == "bfloat16"


@pytest.mark.parametrize(
    "override, needles",
    [
        ("model.dim=abc", ["override 'model.dim=abc'", "model.dim must be an integer, found string"]),
        ("model.dim=130", ["override 'model.dim=130'", "model.dim = 130 is not divisible"]),
        ("model.dimm=3", ["override 'model.dimm=3'", "unknown key model.dimm"]),
        ("modle.dim=3", ["override 'modle.dim=3'", "unknown section [modle]"]),
        ("dim=3", ["override 'dim=3' must look like section.key=value"]),
        ("model.dim", ["must look like section.key=value"]),
    ],
)
def test_bad_override_names_override_and_key(override, needles):
    message = config_error("tiny", [override])
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_to_dict_is_plain_json():
    d = Config().to_dict()
    assert json.loads(json.dumps(d)) == d
    assert set(d) == {"model", "data", "optim", "train", "parallel", "run"}


# A different valid value for every fingerprinted field; a new field must be added here.
ALTERNATIVES = {
    "model": dict(
        vocab_size=512,
        dim=64,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        ffn_hidden=100,
        max_seq_len=256,
        norm_eps=1e-6,
        rope_theta=500000.0,
        init_std=0.01,
        dtype="bfloat16",
    ),
    "data": dict(seq_len=32, batch_size=4, microbatches=1, shuffle_seed=1),
    "optim": dict(
        name="sgd",
        lr=2e-3,
        betas=(0.8, 0.99),
        eps=1e-6,
        weight_decay=0.0,
        momentum=0.5,
        warmup_steps=5,
        schedule="constant",
        schedule_steps=500,
        min_lr=0.0,
        grad_clip=0.0,
    ),
    "train": dict(seed=1, threads=1),
}
SINGLE_CHOICE = {"data.corpus"}  # nothing else to change it to (yet)


def test_fingerprint_covers_every_field_but_run():
    base = Config()
    fingerprint = config_fingerprint(base.to_dict())
    assert fingerprint == config_fingerprint(load_config("tiny").to_dict())
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0

    for section in ("model", "data", "optim", "train"):
        names = {f.name for f in dataclasses.fields(getattr(base, section))}
        covered = set(ALTERNATIVES[section]) | {k.split(".")[1] for k in SINGLE_CHOICE if k.startswith(section + ".")}
        assert names == covered, f"[{section}] fields without an alternative: {names - covered}"
        for key, value in ALTERNATIVES[section].items():
            changed = dataclasses.replace(
                base, **{section: dataclasses.replace(getattr(base, section), **{key: value})}
            )
            assert config_fingerprint(changed.to_dict()) != fingerprint, f"{section}.{key} not fingerprinted"

    longer = dataclasses.replace(base, run=dataclasses.replace(base.run, steps=200, checkpoint_every=0))
    assert config_fingerprint(longer.to_dict()) == fingerprint
    # The layout is paired field by field (tracer.pairing), not through the fingerprint.
    assert config_fingerprint(load_config(None, ["parallel.tp=2", "parallel.sp=true"]).to_dict()) == fingerprint


@pytest.mark.parametrize(
    "override, key",
    [
        ("parallel.tp=3", "model.n_heads = 4 is not divisible by parallel.tp = 3"),
        ("parallel.dp=3", "data.batch_size = 8 is not divisible by parallel.dp = 3"),
        ("parallel.sp=1", "parallel.sp must be true or false"),
        ("parallel.tp=0", "parallel.tp = 0 must be >= 1"),
    ],
)
def test_parallel_layout_must_fit_the_model(override, key):
    assert key in config_error(None, [override])


def test_lr_schedule_does_not_depend_on_run_length():
    optim = Config().optim
    assert optim.lr_at(0) == pytest.approx(optim.lr / optim.warmup_steps)
    assert optim.lr_at(optim.warmup_steps) == pytest.approx(optim.lr)
    assert optim.lr_at(optim.schedule_steps) == pytest.approx(optim.min_lr)
    assert optim.lr_at(10 * optim.schedule_steps) == pytest.approx(optim.min_lr)
    constant = dataclasses.replace(optim, schedule="constant")
    assert constant.lr_at(optim.schedule_steps) == optim.lr
