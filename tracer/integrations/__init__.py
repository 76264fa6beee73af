"""Callbacks that trace a training framework's loop with the same `Tracer` events as a hand-written loop.

- `tracer.integrations.hf`: `SdcTraceCallback` for ``transformers.Trainer`` (extra ``hf``);
- `tracer.integrations.lightning`: `SdcTraceCallback` for ``pytorch_lightning.Trainer`` (extra ``lightning``).

Importing this package imports neither framework; only the module you import does. What each callback
records and what makes its run replayable: docs/integrations.md.
"""
