"""The `RunHeader` a Tracer writes at the head of its log: who recorded what, with which software.

The Tracer builds it once, when it is made, and completes it at the first flush, when the sites
that turned out to give no input gradient are known::

    header = run_header(run, model, sites, layout, rank=0, world_size=1, device=torch.device("cpu"), guard=None)
    ...
    header = with_sites_without_backward(header, {"layers.0.mlp": "its input needs no gradient"})

`software_versions` is the same table replay's logs carry.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import time
import uuid
from collections.abc import Mapping
from importlib import metadata

import torch
from torch import nn

from tracer.config_fingerprint import config_fingerprint, header_config
from tracer.determinism import determinism_settings
from tracer.device import device_determinism, device_versions
from tracer.fingerprint import ALGORITHM
from tracer.guard.guard import Guard
from tracer.log.records import SCHEMA_VERSION, RunHeader
from tracer.options import RunInfo
from tracer.parallel import Layout
from tracer.sharding import parameter_shards
from tracer.sites import named_parameters, stripped_wrappers


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    versions = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.machine()}
    for dist in ("sdctrace", "msgpack", "safetensors"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return tuple(versions.items())


def software_versions() -> dict[str, str]:
    """The software a run was recorded with (read once per process: package metadata is slow to query)."""
    return dict(_versions())


def run_header(
    run: RunInfo,
    model: nn.Module,
    sites: list[tuple[str, nn.Module]],
    layout: Layout,
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    guard: Guard | None,
) -> RunHeader:
    """The header of rank ``rank``'s log of ``run``, tracing ``sites`` of ``model`` on ``device``."""
    config = header_config(run.config)
    return RunHeader(
        schema_version=SCHEMA_VERSION,
        run_id=run.run_id or uuid.uuid4().hex,
        node_label=run.node_label,
        role=run.role,
        world_size=world_size,
        rank=rank,
        config=config,
        config_fingerprint=config_fingerprint(config),
        seed=run.seed,
        data_order_fingerprint=run.data_order_fingerprint,
        fingerprint_algorithm=ALGORITHM,
        versions={**software_versions(), **device_versions(device)},
        device=str(device),
        determinism={**determinism_settings(), **device_determinism(device)},
        created_unix=time.time(),
        # Site hooks add autograd nodes, which can change gradient summation order:
        # the traced sites are part of what makes two runs bit-comparable.
        extra={
            **dict(run.extra),
            "sites": [name for name, _ in sites],
            **({"wrappers": wrapped} if (wrapped := stripped_wrappers(model)) else {}),
            "parallel": layout.header(rank),
            # Which slice of each sharded (DTensor) parameter this rank holds and fingerprints.
            **(
                {"shards": {s.name: s.header() for s in shards}}
                if (shards := parameter_shards(named_parameters(model)))
                else {}
            ),
            **({"guard": guard.describe()} if guard is not None else {}),
        },
    )


def with_sites_without_backward(header: RunHeader, sites_without_backward: Mapping[str, str]) -> RunHeader:
    """The header as the log stores it: with the sites that turned out to give no input gradient (site ->
    why), or ``header`` itself when every site gave one."""
    if not sites_without_backward:
        return header
    extra = {**header.extra, "sites_without_backward": dict(sites_without_backward)}
    return dataclasses.replace(header, extra=extra)
