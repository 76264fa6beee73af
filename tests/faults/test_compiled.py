"""torch.compile under the fault emulator and the ABFT checker: refused in one line, never a run whose faults
silently did not happen (compiled kernels never call the aten ops they act on)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from examples import own_workload
from faults.node import emulated_node, node_options
from faults.profile import load_profile
from sdc.cli import main
from tests.tracer.test_intercept import Seen
from tests.tracer.user_models import tiny_hf_gpt2
from tracer.errors import ConfigError
from tracer.options import RunInfo
from tracer.tracing import Tracer

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = "tests.faults.test_compiled:build_compiled"


def build_compiled(config: Mapping[str, Any], device: torch.device) -> own_workload.CountingLM:
    """examples/own_workload.py's workload with its model compiled in place, as ``model.compile()`` does."""
    w = own_workload.build(config, device)
    w.model.compile(backend="eager")
    return w


def config_error(exc: BaseException) -> ConfigError:
    """The ConfigError that Dynamo re-raised as its own error (its context)."""
    assert isinstance(exc.__context__, ConfigError), repr(exc)
    return exc.__context__


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--fault-profile", "rare-huge"], "fault emulator"),
        (["--abft"], "ABFT checker"),
    ],
)
def test_sdc_record_refuses_a_compiled_model_on_an_emulated_node_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], names: str
) -> None:
    rc = main(["record", "--workload", WORKLOAD, "--steps", "1", "--quiet", "--out", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"sdc: error: sdctrace's {names} cannot act inside torch.compile'd code"), err
    assert "without torch.compile" in err


@pytest.mark.parametrize("how", ["torch.compile", "in place", "a block"])
@pytest.mark.parametrize("abft", [False, True])
def test_a_users_own_script_on_a_visibly_compiled_gpt2_gets_a_plain_config_error_when_the_node_is_built(
    tmp_path: Path, how: str, abft: bool
) -> None:
    """No Dynamo error around it: the emulator and the ABFT checker refuse a compiled model as they are built,
    before anything compiles (transformers' GPT-2 from a config)."""
    model = tiny_hf_gpt2()
    if how == "torch.compile":
        model = torch.compile(model, backend="eager")
    elif how == "in place":
        model.compile(backend="eager")
    else:
        model.transformer.h[1].compile(backend="eager")
    found = "the model's submodule transformer.h.1" if how == "a block" else "the model given to it"
    options = {"abft": True} if abft else {"fault_profile": load_profile("rare-huge")}
    with Tracer(model, None, out=tmp_path / "run", run=RunInfo("sick"), echo=None) as tracer:
        with pytest.raises(ConfigError) as caught:
            emulated_node(tracer, model, **options)
    message = str(caught.value)
    assert type(caught.value) is ConfigError and "\n" not in message, message
    names = "ABFT checker" if abft else "fault emulator"
    assert message.startswith(
        f"sdctrace's {names} cannot act inside torch.compile'd code ({found} is compiled): compiled kernels"
    ), message


@pytest.mark.slow  # a fresh Python process (or a compile) of a few seconds
def test_a_compiled_model_records_as_before_without_an_emulator(tmp_path: Path) -> None:
    assert main(["record", "--workload", WORKLOAD, "--steps", "1", "--quiet", "--out", str(tmp_path / "run")]) == 0


def test_a_model_compiled_and_run_before_the_emulator_entered_is_refused_when_it_next_runs() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(2, 4)
    compiled(x).sum().backward()  # compiled without any interceptor: runs
    with pytest.raises(Exception) as caught, Seen(torch.ops.aten.mm, torch.ops.aten.addmm):
        compiled(x).sum().backward()
    assert "operator interceptor cannot act inside torch.compile'd code" in str(config_error(caught.value))
    compiled(x).sum().backward()  # and runs again once no interceptor is active


@pytest.mark.slow
def test_a_compiled_gpt2_under_the_hf_trainer_is_refused_at_its_first_step(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from tracer.integrations.hf import SdcTraceCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        per_device_train_batch_size=2,
        max_steps=2,
        torch_compile=True,
        torch_compile_backend="aot_eager",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = SdcTraceCallback(tmp_path / "run", "node-b", **node_options(load_profile("rare-huge"), 1))
    trainer = Trainer(
        model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids], callbacks=[callback]
    )
    with pytest.raises(Exception) as caught, callback:
        trainer.train()
    assert "fault emulator cannot act inside torch.compile'd code" in str(config_error(caught.value))


@pytest.mark.slow  # a fresh Python process (or a compile) of a few seconds
def test_a_compilation_that_first_imports_dynamo_under_an_interceptor_is_refused() -> None:
    """Dynamo is not loaded when the interceptor enters (importing it costs seconds); compiling loads it."""
    script = (
        "import sys, torch\n"
        "from tests.tracer.test_intercept import Seen\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "f = torch.nn.Linear(3, 3)\n"
        "with Seen(torch.ops.aten.addmm):\n"
        "    try:\n"
        "        torch.compile(f, backend='eager')(torch.randn(2, 3))\n"
        "    except Exception as e:\n"
        "        print(f'{type(e.__context__).__name__}: {e.__context__}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ConfigError: sdctrace's operator interceptor cannot act inside"), done.stdout
