"""Device names resolve to torch devices, or to one-line errors that say what is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from sdc.cli import main
from tracer.device import is_lazy, reinterpret, resolve_device, to_host
from tracer.errors import UsageError


def test_cpu_resolves_and_is_eager() -> None:
    assert resolve_device("cpu") == torch.device("cpu") and not is_lazy(torch.device("cpu"))


@pytest.mark.parametrize("name", ["tpu", "gpu:0", ""])
def test_unknown_devices_are_refused_by_name(name: str) -> None:
    with pytest.raises(UsageError, match="expected one of cpu, cuda, xla"):
        resolve_device(name)


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed here")
def test_xla_without_torch_xla_is_a_one_line_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--device", "xla", "--out", str(tmp_path / "x"), "--quiet"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: --device xla: torch_xla is not importable") and "docs/xla.md" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="sees no CUDA device"):
        resolve_device("cuda")


def test_eager_reinterpret_and_to_host_are_plain_views_and_copies() -> None:
    t = torch.tensor([1.0, -2.0], dtype=torch.float32)
    assert torch.equal(reinterpret(t, torch.int32), t.view(torch.int32))
    (host,) = to_host([t])
    assert host.device.type == "cpu" and torch.equal(host, t) and to_host([]) == []
