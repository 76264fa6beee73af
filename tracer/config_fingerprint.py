"""The config a run header carries, and the one rule that fingerprints it.

Any JSON-like mapping is a config: a workload's dataclasses as a dict, a Hugging
Face ``PretrainedConfig.to_dict()``, a user's own settings. Two runs pair only if
their config fingerprints are equal, so there is exactly one rule: the sha256 of
the config's canonical JSON, leaving out the top-level sections that never decide
the bits of a step:

- ``run``: how long to train and how often to checkpoint (a 20-step and a 200-step
  run of the same config still pair);
- ``parallel``: the rank layout, which pairing compares field by field so that a
  refused pair names the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

UNFINGERPRINTED = ("run", "parallel")


def header_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``config`` as plain JSON data: mapping keys become strings (``{1: "x"}`` -> ``{"1": "x"}``),
    tuples and sets lists, anything else that JSON cannot hold its ``str()``."""
    return _plain(dict(config or {}))


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of everything in ``config`` but its `UNFINGERPRINTED` sections."""
    kept = {k: v for k, v in header_config(config).items() if k not in UNFINGERPRINTED}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)
