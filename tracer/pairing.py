"""Which run-header fields two runs must share to be compared bit for bit, and how two headers differ in them:

    pairing_differences(golden, suspect)   # ["world_size: 2 vs 4", "shards.placements: ...", ...]
    check_pair(golden, suspect, "golden", "suspect")   # raises one ValidationError naming every field
    setting_warnings(golden, suspect)      # ["determinism.env.NCCL_ALGO: '' vs 'Ring' (changes bits only ...)"]

A bit-changing setting (`tracer.bit_settings`) that differs refuses the pair where it changes the bits of the
device both runs used, and is only a warning elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracer.bit_settings import setting_differences
from tracer.errors import ValidationError
from tracer.log.records import RunHeader
from tracer.parallel import LAYOUT_FIELDS, layout_of
from tracer.sharding import shards_of

PAIRING_FIELDS = (
    "schema_version",
    "config_fingerprint",
    "seed",
    "data_order_fingerprint",
    "fingerprint_algorithm",
    "world_size",
)


def pairing_differences(golden: RunHeader, suspect: RunHeader, fields: Sequence[str] = PAIRING_FIELDS) -> list[str]:
    """Every pairing field that differs, as ``field: golden-value vs suspect-value``."""
    out = []
    for name in fields:
        a, b = getattr(golden, name), getattr(suspect, name)
        if a != b:
            out.append(f"{name}: {a!r} vs {b!r}")
    # Another split of the same model sums in another order: the layout must match field by field.
    layout_g, layout_s = layout_of(golden.extra, golden.world_size), layout_of(suspect.extra, suspect.world_size)
    for name in LAYOUT_FIELDS:
        if layout_g.get(name) != layout_s.get(name):
            out.append(f"parallel.{name}: {layout_g.get(name)!r} vs {layout_s.get(name)!r}")
    out += shard_differences(golden.extra, suspect.extra)
    threads = (
        "intra_op_threads",
        golden.determinism.get("intra_op_threads"),
        suspect.determinism.get("intra_op_threads"),
    )
    if threads[1] != threads[2]:
        out.append(f"determinism.intra_op_threads: {threads[1]!r} vs {threads[2]!r}")
    out += [d.describe() for d in setting_differences(golden, suspect) if d.refuses]
    # Traced sites change the autograd graph (see Tracer); a replay log carries its golden's.
    sites_g, sites_s = golden.extra.get("sites"), suspect.extra.get("sites")
    if sites_g is not None and sites_s is not None and sites_g != sites_s:
        out.append(_sites_difference(sites_g, sites_s))
    return out


def setting_warnings(golden: RunHeader, suspect: RunHeader) -> list[str]:
    """The bit-changing settings that differ but do not stop the pair (they change no bits on the device the
    runs used), one line each, naming the setting and both values."""
    return [d.describe() for d in setting_differences(golden, suspect) if not d.refuses]


def shard_differences(golden: Mapping[str, Any], suspect: Mapping[str, Any], shown: int = 2) -> list[str]:
    """How two headers' sharded layouts differ: one message per differing field (mesh shape, mesh dimension
    names, placements, global shape), naming a few of the parameters, and one for parameters sharded in one
    run only. Offsets and local shapes follow from these and the rank, so they are not compared."""
    a, b = shards_of(golden), shards_of(suspect)
    out = []
    for which, names in (("first", [n for n in a if n not in b]), ("second", [n for n in b if n not in a])):
        if names:
            out.append(f"shards: {len(names)} parameters sharded only in the {which} run ({_few(names, shown)})")
    both = [n for n in a if n in b]
    for field in ("mesh_shape", "mesh_dims", "placements", "global_shape"):
        differ = [n for n in both if getattr(a[n], field) != getattr(b[n], field)]
        if differ:
            first = differ[0]
            out.append(
                f"shards.{field}: {list(getattr(a[first], field))} vs {list(getattr(b[first], field))} for "
                f"{len(differ)} parameters ({_few(differ, shown)})"
            )
    if out:
        out[-1] += " (record both with the same device mesh and fully_shard/parallelize_module plan)"
    return out


def _sites_difference(a: list[str], b: list[str], shown: int = 3) -> str:
    """Which sites only one run traced, a few by name."""
    only_a, only_b = [s for s in a if s not in set(b)], [s for s in b if s not in set(a)]
    sides = (("first", only_a), ("second", only_b))
    parts = [f"only in the {which}: {_few(names, shown)}" for which, names in sides if names]
    return (
        f"extra.sites: {len(a)} traced sites vs {len(b)}, {'; '.join(parts) or 'the same in another order'} "
        "(trace both at the same sites: TraceOptions(sites=...) in Python, --sites with sdc record)"
    )


def _few(names: list[str], shown: int) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_pair(golden: RunHeader, suspect: RunHeader, golden_name: str, suspect_name: str) -> None:
    """Raise one error listing every field that stops the two runs from pairing."""
    diffs = pairing_differences(golden, suspect)
    if diffs:
        raise ValidationError(
            f"{golden_name} and {suspect_name} do not pair (record both with the same config, seed and "
            f"software settings): " + "; ".join(diffs)
        )


TWIN_SEED = "finetune.shuffle_seed"
BASELINE_SEED = "data.shuffle_seed"  # a pretraining run's data order (the drift baseline's twin)


def twin_differences(golden: RunHeader, twin: RunHeader, *, seed: str = TWIN_SEED, role: str = "finetune") -> list[str]:
    """Why `twin` is not `golden`'s shuffle-seed twin: two runs of `role` that differ in the config's `seed`
    key and nothing else (fine-tunes of the same pretraining run by default; `BASELINE_SEED` and ``train``
    for the pretraining baseline, which must then also be fault-free like golden). Their config and
    data-order fingerprints differ by construction; every config value is compared instead."""
    shared = [f for f in PAIRING_FIELDS if f not in ("config_fingerprint", "data_order_fingerprint")]
    out = pairing_differences(golden, twin, shared)
    if (golden.role, twin.role) != (role, role):
        kind = "fine-tunes" if role == "finetune" else f"{role!r} runs"
        out.append(f"role: {golden.role!r} vs {twin.role!r} (both must be {kind})")
    for key in ("finetune_of", "tasks", *(("fault_profile",) if role == "train" else ())):
        if golden.extra.get(key) != twin.extra.get(key):
            out.append(f"extra.{key}: {golden.extra.get(key)!r} vs {twin.extra.get(key)!r}")
    g, t = _flat(golden.config), _flat(twin.config)
    out += [
        f"config.{k}: {g.get(k)!r} vs {t.get(k)!r}"
        for k in sorted(set(g) | set(t))
        if k != seed and g.get(k) != t.get(k)
    ]
    if seed in g and g.get(seed) == t.get(seed):
        out.append(f"config.{seed}: both {g.get(seed)!r} (a twin must differ here)")
    return out


def baseline_differences(golden: RunHeader, twin: RunHeader) -> list[str]:
    """Why `twin` is not `golden`'s shuffle-seed twin (`sdc diff --baseline`): its pretraining twin when golden
    pretrains, its fine-tune twin when golden is a fine-tune (a healthy pair whose loss spikes are a null)."""
    if golden.role == "finetune":
        return twin_differences(golden, twin)
    return twin_differences(golden, twin, seed=BASELINE_SEED, role="train")


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
