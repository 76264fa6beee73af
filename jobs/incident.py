"""The incident job: claim the bundle's folder, capture the divergent site, write the bundle.

    request = IncidentRequest(golden, out, suspect_from_run(run, header, golden))   # at=None: the first divergence
    manifest = incident(request)                   # the bundle's manifest (replay/bundle_files.py)
    result = reproduce_bundle(out, profile, fault_seed=0)    # `sdc incident reproduce`: under the emulator, or not

The folder is claimed (`tracer.log.claim.claim_folder`, kind ``incident bundle``) before the capture runs, so a
refusal is quick: ``--out`` must not exist, be empty, or hold a bundle sdctrace wrote (replaced with
``overwrite``). Single-rank golden runs only (replay/capture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults import FaultProfile
from replay.bundle_emulated import reproduce_emulated
from replay.bundle_files import INCIDENT_FOLDER, write_bundle
from replay.bundle_reproduce import reproduce
from replay.capture import SiteKey, capture, first_divergence, require_forward
from replay.request import Suspect
from tracer.errors import UsageError
from tracer.log import LogReader, rank_dir
from tracer.log.claim import claim_folder


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
    with claim_folder(
        request.out, INCIDENT_FOLDER, overwrite=request.overwrite, inputs=(request.golden, request.suspect.run)
    ):
        captured = capture(request.golden, request.suspect, site, request.workload)
        return write_bundle(
            captured,
            request.out,
            suspect={"node_label": request.suspect.label, **request.suspect.source},
            golden={"path": str(request.golden), "run_id": header.run_id, "node_label": header.node_label},
        )


def reproduce_bundle(
    bundle: Path, profile: FaultProfile | None, *, fault_seed: int = 0, repeats: int = 5, device: str | None = None
) -> dict[str, Any]:
    """Run the bundle's reproduction here, under ``profile``'s emulator when one is given."""
    if profile is None:
        return reproduce(bundle, repeats, device)
    return reproduce_emulated(bundle, profile, fault_seed=fault_seed, repeats=repeats, device=device)
