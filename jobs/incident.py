"""The incident job: claim the bundle's folder, capture the divergent site, write the bundle.

    request = IncidentRequest(golden, out, suspect_from_run(run, header, golden))   # at=None: the first divergence
    manifest = incident(request)                   # the bundle's manifest (replay/bundle_files.py)
    result = reproduce_bundle(out, profile, fault_seed=0)    # `sdc incident reproduce`: under the emulator, or not

The folder is claimed (`tracer.log.claim.claim_folder`, kind ``incident bundle``) before the capture runs, so a
refusal is quick: ``--out`` must not exist, be empty, or hold a bundle sdctrace wrote (replaced with
``overwrite``). Single-rank golden runs, and pipeline-parallel ones: every stage is launched as a rank and runs the
step, and the stage that holds the site captures it and writes the bundle (replay/capture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from faults import FaultProfile
from jobs.launch import launch
from jobs.replay import golden_header
from replay.bundle_emulated import reproduce_emulated
from replay.bundle_files import INCIDENT_FOLDER, write_bundle
from replay.bundle_reproduce import reproduce
from replay.capture import SiteKey, capture, first_divergence, require_capturable, require_forward
from replay.request import Suspect
from tracer.errors import UsageError, ValidationError
from tracer.log import LogReader, rank_dir
from tracer.log.claim import claim_folder
from tracer.log.records import Phase, RunHeader


@dataclass(frozen=True)
class IncidentRequest:
    """One incident bundle, as `sdc incident` asks for it."""

    golden: Path
    out: Path
    suspect: Suspect
    at: SiteKey | None = None  # None: the pair's first divergence (the suspect must be a recorded run)
    workload: str | None = None  # the factory that rebuilds the golden run (None: the reference workload)
    overwrite: bool = False


def incident(request: IncidentRequest) -> dict[str, Any]:
    """Capture the site and write the bundle into ``request.out``; the manifest."""
    site = request.at
    if site is None:
        if request.suspect.run is None:
            raise UsageError(
                "an emulated suspect (--fault-profile) has no recorded run to find the first divergence "
                "in: pass --at STEP:MB:SITE:forward"
            )
        site = first_divergence(request.golden, request.suspect.run)
    require_forward(site)  # before the folder is claimed
    header = LogReader(rank_dir(request.golden, 0)).header
    require_capturable(request.golden, header)
    if header.world_size > 1:
        golden_header(request.golden)  # every stage's log there, and the ranks this machine runs, before a launch
    with claim_folder(
        request.out, INCIDENT_FOLDER, overwrite=request.overwrite, inputs=(request.golden, request.suspect.run)
    ) as lock:
        if header.world_size == 1:
            manifest = _write(request, site, header)
            assert manifest is not None, "a single-rank run holds every site"
            return manifest
        # A pipeline: every stage runs the step, the one that holds the site writes the bundle.
        kwargs = {"request": _to_json(request), "site": site.to_json()}
        written = [m for m in launch("jobs.incident:incident_rank", kwargs, header.world_size, lock=lock) if m]
    if not written:
        raise ValidationError(f"{request.golden}: no pipeline stage holds {site.name}; pass --at naming a traced site")
    return written[0]


def incident_rank(request: dict[str, Any], site: dict[str, Any]) -> dict[str, Any]:
    """One launched stage of a pipeline's capture: the bundle's manifest on the stage that holds the site, else
    an empty dict."""
    at = SiteKey(site["step"], site["microbatch"], site["name"], Phase[site["phase"].upper()])
    golden = Path(request["golden"])
    incident_request = IncidentRequest(
        golden, Path(request["out"]), Suspect.from_json(request["suspect"]), at, request["workload"]
    )
    return _write(incident_request, at, LogReader(rank_dir(golden, 0)).header) or {}


def _write(request: IncidentRequest, site: SiteKey, header: RunHeader) -> dict[str, Any] | None:
    """Capture ``site`` on this rank and write the bundle; None on a pipeline stage that does not hold it."""
    captured = capture(request.golden, request.suspect, site, request.workload)
    if captured is None:
        return None
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return write_bundle(
        captured,
        request.out,
        suspect={"node_label": request.suspect.label, **request.suspect.source},
        # the rank the site ran on (a pipeline's stage): a reproduction under emulation plays it
        golden={"path": str(request.golden), "run_id": header.run_id, "node_label": header.node_label, "rank": rank},
    )


def _to_json(request: IncidentRequest) -> dict[str, Any]:
    """What a launched stage needs of ``request`` (the site goes apart), as plain data."""
    return {
        "golden": str(request.golden),
        "out": str(request.out),
        "suspect": request.suspect.to_json(),
        "workload": request.workload,
    }


def reproduce_bundle(
    bundle: Path, profile: FaultProfile | None, *, fault_seed: int = 0, repeats: int = 5, device: str | None = None
) -> dict[str, Any]:
    """Run the bundle's reproduction here, under ``profile``'s emulator when one is given."""
    if profile is None:
        return reproduce(bundle, repeats, device)
    return reproduce_emulated(bundle, profile, fault_seed=fault_seed, repeats=repeats, device=device)
