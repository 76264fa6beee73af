"""The global torch RNG at each step's start, so that a step that draws from it (dropout) replays.

A checkpoint saves every generator before its step, but a training loop may draw from the global torch
RNG between a checkpoint, or the previous step's end, and the step's first forward: a data loader's iterator
takes its base seed from it at every epoch's start (``iter(DataLoader(...))`` without a ``generator``). A
replay rebuilds a step from the checkpoint and the steps before it, never from that draw. So the Tracer logs,
at each step's start, an ``rng`` event with the fingerprint of the torch generators' states (CPU, and every
initialised CUDA device's), and where they are not what the last point a replay rebuilds left (the previous
step's end, or a checkpoint since), it stores them as a blob too: then replay restores them there. A loop that
draws nothing between steps pays two 5 KB copies, a comparison and a fingerprint a step, and writes 30 bytes;
one that does (once an epoch for the HF Trainer) writes a 5 KB blob at those steps.

Python's and NumPy's generators are in checkpoints only: data pipelines draw from them, the step's tensors
from torch's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tracer.blobs import BlobStore
from tracer.errors import LogError
from tracer.fingerprint import fingerprint
from tracer.intercept import own_ops


@dataclass(frozen=True)
class TorchRng:
    """The torch generators' states as one byte tensor: the CPU's, then each CUDA device's (``devices``)."""

    state: torch.Tensor  # uint8
    devices: int

    @classmethod
    def now(cls) -> TorchRng:
        with own_ops():
            parts = [torch.get_rng_state()]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                parts += torch.cuda.get_rng_state_all()
            return cls(torch.cat(parts) if len(parts) > 1 else parts[0], len(parts) - 1)

    @property
    def fingerprint(self) -> int:
        with own_ops():
            return fingerprint(self.state)

    def restore(self) -> None:
        """Make these the global generators' states."""
        with own_ops():
            cpu = torch.get_rng_state().numel()
            rest = self.state.numel() - cpu
            cuda = torch.cuda.device_count() if self.devices else 0
            if (
                rest < 0
                or (self.devices and (cuda < self.devices or rest % self.devices))
                or (not self.devices and rest)
            ):
                raise LogError(
                    f"the recorded RNG state ({self.state.numel()} bytes, {self.devices} CUDA "
                    f"device(s)) does not fit this machine's generators ({cpu} bytes on the CPU, {cuda} "
                    "CUDA device(s)); replay on a machine like the recording's"
                )
            torch.set_rng_state(self.state[:cpu].clone())
            if self.devices:
                torch.cuda.set_rng_state_all(list(self.state[cpu:].clone().chunk(self.devices)))


class StepRng:
    """The Tracer's bookkeeping for ``rng`` events: what a replay would have at the next step's start."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self._rebuilt: torch.Tensor | None = None  # the state at the last step's end or checkpoint since

    def step_start(self) -> dict[str, Any]:
        """The ``rng`` event's fields for the step starting now; stores the state if a replay could not rebuild it."""
        rng = TorchRng.now()
        fp = rng.fingerprint
        with own_ops():
            stored = self._rebuilt is None or not torch.equal(rng.state, self._rebuilt)
        if stored:
            with own_ops():
                self.blobs.put(fp, rng.state)
        return {"fingerprint": fp, "devices": rng.devices, "stored": stored}

    def rebuilt_here(self) -> None:
        """A step ended or a checkpoint was saved: a replay has the generators' states of this point."""
        self._rebuilt = TorchRng.now().state


def recorded_rng(blobs: BlobStore, fields: dict[str, Any]) -> TorchRng:
    """The state an ``rng`` event with ``stored`` holds, from the blob store (checked against its fingerprint)."""
    return TorchRng(blobs.get(fields["fingerprint"]), int(fields["devices"]))
