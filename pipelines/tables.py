"""Arrow schemas of the Parquet tables the diff pipeline writes, one per DuckDB table.

`analysis/schema.sql` declares the same columns (plus `pair_id`, which the loader adds,
since a staging directory holds one pair); a test keeps the two in step. ``errors`` is
staging-only: the launcher fails the diff on any row.
`analysis/SCHEMA.md` says what every column means.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from tracer.log import Phase

# Fixed dictionaries: the columns store small codes, readers see strings.
PHASES = [p.name.lower() for p in sorted(Phase)]  # index = Phase value
# within_tolerance: the bits differ within the tolerance map's band for the place (sdc diff --tolerance): not SDC.
STATUSES = ["equal", "differ", "golden_only", "suspect_only", "within_tolerance"]

_STR = pa.dictionary(pa.int32(), pa.string())  # repeated names: dictionary-encoded in memory and on disk
_CODE = pa.dictionary(pa.int8(), pa.string())  # a few fixed values (PHASES, STATUSES)

_EVENT_COLUMNS = [
    ("rank", pa.int32()),
    ("step", pa.int64()),
    ("microbatch", pa.int64()),
    ("name", _STR),
    ("phase", _CODE),
    ("occurrence", pa.int32()),
    ("status", _CODE),
    ("equal", pa.bool_()),
    ("golden_fingerprint", pa.uint64()),
    ("suspect_fingerprint", pa.uint64()),
    ("golden_l2", pa.float32()),
    ("suspect_l2", pa.float32()),
    ("golden_absmax", pa.float32()),
    ("suspect_absmax", pa.float32()),
    ("golden_nan", pa.int64()),
    ("suspect_nan", pa.int64()),
    ("golden_inf", pa.int64()),
    ("suspect_inf", pa.int64()),
    ("meta", _STR),
    ("golden_segment", pa.int32()),
    ("golden_offset", pa.int64()),
    ("suspect_segment", pa.int32()),
    ("suspect_offset", pa.int64()),
]

SCHEMAS: dict[str, pa.Schema] = {
    "runs": pa.schema(
        [
            ("run_id", pa.string()),
            ("rank", pa.int32()),
            ("path", pa.string()),
            ("node_label", pa.string()),
            ("role", pa.string()),
            ("world_size", pa.int32()),
            ("schema_version", pa.int32()),
            ("config_fingerprint", pa.string()),
            ("seed", pa.int64()),
            ("data_order_fingerprint", pa.string()),
            ("fingerprint_algorithm", pa.string()),
            ("device", pa.string()),
            ("created_unix", pa.float64()),
            ("config", pa.string()),
            ("versions", pa.string()),
            ("determinism", pa.string()),
            ("extra", pa.string()),
            ("segments", pa.int32()),
            ("records", pa.int64()),
            ("complete", pa.bool_()),
            ("torn_tail", pa.bool_()),
            ("last_step", pa.int64()),
            ("status", pa.string()),
        ]
    ),
    "pairs": pa.schema(
        [
            ("golden_path", pa.string()),
            ("suspect_path", pa.string()),
            ("golden_run_id", pa.string()),
            ("suspect_run_id", pa.string()),
            ("replay_paths", pa.list_(pa.string())),
            ("replay_run_ids", pa.list_(pa.string())),
            ("twin_run_id", pa.string()),
            ("baseline", pa.bool_()),
            ("world_size", pa.int32()),
            ("ranks", pa.int32()),
            ("steps_per_bucket", pa.int32()),
            ("created_unix", pa.float64()),
            ("sdctrace_version", pa.string()),
        ]
    ),
    "pair_ranks": pa.schema(
        [
            ("rank", pa.int32()),
            ("golden_run_id", pa.string()),
            ("suspect_run_id", pa.string()),
            ("golden_last_step", pa.int64()),
            ("suspect_last_step", pa.int64()),
            ("compared_through", pa.int64()),
            ("golden_status", pa.string()),
            ("suspect_status", pa.string()),
            ("lost_steps", pa.int64()),
        ]
    ),
    "event_diffs": pa.schema(_EVENT_COLUMNS),
    "first_divergence": pa.schema(_EVENT_COLUMNS),
    "divergence_steps": pa.schema(
        [
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("events", pa.int64()),
            ("differing", pa.int64()),
            ("sites_differing", pa.int64()),
            ("inputs_differing", pa.int64()),
            ("grads_differing", pa.int64()),
            ("params_differing", pa.int64()),
            ("first_microbatch", pa.int64()),
            ("first_name", pa.string()),
            ("first_phase", pa.string()),
        ]
    ),
    "loss": pa.schema(
        [
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("golden_loss", pa.float64()),
            ("suspect_loss", pa.float64()),
            ("diff", pa.float64()),
            ("rel_diff", pa.float64()),
            ("lr", pa.float64()),
        ]
    ),
    "loss_spikes": pa.schema(
        [
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("side", pa.string()),
            ("loss", pa.float64()),
            ("baseline", pa.float64()),
            ("ratio", pa.float64()),
        ]
    ),
    "param_drift": pa.schema(
        [
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("group", pa.string()),
            ("elements", pa.int64()),
            ("golden_norm", pa.float64()),
            ("diff_norm", pa.float64()),
            ("drift", pa.float64()),
        ]
    ),
    "site_mismatch": pa.schema(
        [
            ("replay_run_id", pa.string()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("microbatch", pa.int64()),
            ("site", pa.string()),
            ("phase", pa.string()),
            ("elements", pa.int64()),
            ("mismatched", pa.int64()),
            ("frequency", pa.float64()),
            ("severity", pa.float64()),
            ("max_rel", pa.float64()),
        ]
    ),
    "grad_noise": pa.schema(
        [
            ("replay_run_id", pa.string()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("name", pa.string()),
            ("diff_l2", pa.float64()),
            ("golden_l2", pa.float64()),
            ("ratio", pa.float64()),
        ]
    ),
    "faults": pa.schema(
        [
            ("side", pa.string()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("microbatch", pa.int64()),
            ("site", pa.string()),
            ("op", pa.string()),
            ("phase", pa.string()),
            ("kind", pa.string()),
            ("elements", pa.int64()),
            ("indices", pa.list_(pa.int64())),
            ("original", pa.list_(pa.float64())),
            ("corrupted", pa.list_(pa.float64())),
            ("detail", pa.string()),
            ("segment", pa.int32()),
            ("offset", pa.int64()),
            ("traced_site", pa.string()),
            ("fingerprint_detected", pa.bool_()),
            ("abft_flagged", pa.bool_()),
        ]
    ),
    "abft": pa.schema(
        [
            ("side", pa.string()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("microbatch", pa.int64()),
            ("site", pa.string()),
            ("op", pa.string()),
            ("phase", pa.string()),
            ("m", pa.int64()),
            ("k", pa.int64()),
            ("n", pa.int64()),
            ("residual", pa.float64()),
            ("bound", pa.float64()),
            ("verdict", pa.string()),
            ("faulted", pa.bool_()),
            ("outcome", pa.string()),
        ]
    ),
    "detection_scores": pa.schema(
        [
            ("rank", pa.int32()),
            ("detector", pa.string()),
            ("side", pa.string()),
            ("units", pa.int64()),
            ("tp", pa.int64()),
            ("fp", pa.int64()),
            ("fn", pa.int64()),
            ("tn", pa.int64()),
            ("propagated", pa.int64()),
        ]
    ),
    "detector_alarms": pa.schema(
        [
            ("rank", pa.int32()),
            ("run_id", pa.string()),
            ("node_label", pa.string()),
            ("step", pa.int64()),
            ("detector", _STR),
            ("fired", pa.bool_()),
            ("measured", pa.float64()),
            ("threshold", pa.float64()),
            ("detail", pa.string()),
            ("faults", pa.int64()),
            ("guarded", pa.bool_()),
            ("loss", pa.float64()),
            ("wall_s", pa.float64()),
        ]
    ),
    "guard_decisions": pa.schema(
        [
            ("rank", pa.int32()),
            ("run_id", pa.string()),
            ("node_label", pa.string()),
            ("step", pa.int64()),
            ("detectors", pa.list_(pa.string())),
            ("outcome", pa.string()),
            ("action", pa.string()),
            ("accepted", pa.int64()),
            ("runs", pa.int64()),
            ("first_run_faults", pa.int64()),
            ("accepted_run_faults", pa.int64()),
        ]
    ),
    "finetune_eval": pa.schema(
        [
            ("run_id", pa.string()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("task", pa.string()),
            ("examples", pa.int64()),
            ("correct", pa.int64()),
            ("accuracy", pa.float64()),
            ("chance", pa.float64()),
            ("collapsed", pa.bool_()),
        ]
    ),
    "sharpness": pa.schema(
        [
            ("run_id", pa.string()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("value", pa.float64()),
            ("iterations", pa.int64()),
            ("converged", pa.bool_()),
            ("residual", pa.float64()),
            ("method", pa.string()),
            ("microbatch", pa.int64()),
        ]
    ),
    "finetune_predictions": pa.schema(
        [
            ("run_id", pa.string()),
            ("rank", pa.int32()),
            ("step", pa.int64()),
            ("task", _STR),
            ("example", pa.int64()),
            ("predicted", pa.int32()),
            ("answer", pa.int32()),
        ]
    ),
    "lost_ranges": pa.schema(
        [
            ("run_id", pa.string()),
            ("side", pa.string()),
            ("rank", pa.int32()),
            ("path", pa.string()),
            ("offset", pa.int64()),
            ("bytes", pa.int64()),
            ("records", pa.int64()),
            ("first_step", pa.int64()),
            ("last_step", pa.int64()),
        ]
    ),
    "corruptions": pa.schema(
        [
            ("run_id", pa.string()),
            ("side", pa.string()),
            ("rank", pa.int32()),
            ("path", pa.string()),
            ("offset", pa.int64()),
            ("reason", pa.string()),
        ]
    ),
}

# Written to staging but never loaded: any row fails the job (see pipelines/staging.py).
SCHEMAS["errors"] = pa.schema(
    [("side", pa.string()), ("rank", pa.int32()), ("path", pa.string()), ("message", pa.string())]
)

TABLES = "tables"  # the output tag of every step that produces rows of these tables: (name, pa.Table)


def table(name: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts) as a table of `name`'s schema; missing keys are nulls."""
    return pa.Table.from_pylist(list(rows), schema=SCHEMAS[name])


def named(name: str, rows: Iterable[Mapping[str, Any]]) -> tuple[str, pa.Table]:
    """An element for `pipelines.sink.WriteTables`."""
    return name, table(name, rows)
