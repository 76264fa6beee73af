"""Shared by the fault emulator and ABFT tests: the shipped profile names, events of a run."""

from __future__ import annotations

from tests.support import events

__all__ = ["SHIPPED", "events"]

SHIPPED = {"healthy-node", "bursty-mismatch", "rare-huge", "loss-spike", "softmax-norm"}
