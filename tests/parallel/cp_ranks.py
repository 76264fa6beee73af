"""What the context-parallel tests launch in each rank (`jobs.launch`): torch's ``context_parallel`` on CPU and gloo.

launch("tests.parallel.cp_ranks:ring_attention", {}, 2)        # "ok <max error>" or the error torch raises
launch("tests.parallel.cp_ranks:traced", {"out": str(run)}, 2)  # the Tracer's refusal, one line
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel

from tracer import RunInfo, TraceOptions, Tracer
from tracer.errors import SdcError

B, H, T, D = 1, 2, 8, 4  # batch, heads, sequence, head width: 8 positions split over the ranks


def _qkv() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(3)]  # 3 x (B, H, T, D)


def ring_attention() -> str:
    """Causal attention with the sequence sharded by ``context_parallel``: "ok" and its largest difference from
    the unsharded attention of this rank's positions, or the first line of what torch raised."""
    q, k, v = _qkv()
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v}):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T / ranks, D)
    except Exception as exc:  # noqa: BLE001 - the finding is whatever torch raises
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return f"ok {float((out - whole[:, :, : out.shape[2]]).abs().max()) if out.shape == whole.shape else out.shape}"


class Attend(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, T, D) -> (B, H, T, D)
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


def traced(out: str) -> str:
    """A traced model's forward inside ``context_parallel``: the Tracer's error, as one line."""
    model = nn.Sequential(nn.Linear(D, D), Attend())  # the site: the attention, "1"
    (x, *_) = _qkv()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    run = RunInfo("context-parallel")
    with Tracer(model, optimizer, run=run, out=out, options=TraceOptions(sites=r"1")) as tracer, tracer.step(0):
        tracer.microbatch(0, inputs=x)
        try:
            with context_parallel(mesh, buffers=[x], buffer_seq_dims=[2], no_restore_buffers={x}):
                model(x)
        except SdcError as exc:
            return f"{type(exc).__name__}: {exc}"
    return "not refused"
