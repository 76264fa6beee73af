"""Which run-header fields two runs must share to be compared bit for bit."""

from __future__ import annotations

from tracer.errors import ValidationError
from tracer.log.records import RunHeader
from tracer.parallel import LAYOUT_FIELDS, layout_of

PAIRING_FIELDS = (
    "schema_version",
    "config_fingerprint",
    "seed",
    "data_order_fingerprint",
    "fingerprint_algorithm",
    "world_size",
)


def pairing_differences(golden: RunHeader, suspect: RunHeader) -> list[str]:
    """Every pairing field that differs, as ``field: golden-value vs suspect-value``."""
    out = []
    for name in PAIRING_FIELDS:
        a, b = getattr(golden, name), getattr(suspect, name)
        if a != b:
            out.append(f"{name}: {a!r} vs {b!r}")
    # Another split of the same model sums in another order: the layout must match field by field.
    layout_g, layout_s = layout_of(golden.extra, golden.world_size), layout_of(suspect.extra, suspect.world_size)
    for name in LAYOUT_FIELDS:
        if layout_g.get(name) != layout_s.get(name):
            out.append(f"parallel.{name}: {layout_g.get(name)!r} vs {layout_s.get(name)!r}")
    threads = ("intra_op_threads", golden.determinism.get("intra_op_threads"), suspect.determinism.get("intra_op_threads"))
    if threads[1] != threads[2]:
        out.append(f"determinism.intra_op_threads: {threads[1]!r} vs {threads[2]!r}")
    # Traced sites change the autograd graph (see Tracer); replay logs carry none.
    sites_g, sites_s = golden.extra.get("sites"), suspect.extra.get("sites")
    if sites_g is not None and sites_s is not None and sites_g != sites_s:
        out.append(f"extra.sites: {len(sites_g)} traced sites vs {len(sites_s)} (record both with the same --sites)")
    return out


def check_pair(golden: RunHeader, suspect: RunHeader, golden_name: str, suspect_name: str) -> None:
    """Raise one error listing every field that stops the two runs from pairing."""
    diffs = pairing_differences(golden, suspect)
    if diffs:
        raise ValidationError(
            f"{golden_name} and {suspect_name} do not pair (record both with the same config, seed and "
            f"software settings): " + "; ".join(diffs)
        )
