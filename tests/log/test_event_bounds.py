"""Every integer field of an EVENT that a reader uses is bounded where the record is decoded, by what its column in
the diff's tables holds: a crafted event beyond a bound is refused by the reader, `sdc inspect` and `sdc diff` alike,
with the file and offset, in one line (issue 31, case 7: a fault event with microbatch 2^64-1 read fine, then crashed
the Beam diff). The events are written at the byte level, framed with a valid CRC, as the other schema tests do."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgpack
import pytest

from sdc.cli import main
from tests.log.test_log_schema import first, inspect_error, segment
from tests.support import reframe
from tracer.errors import LogCorruptionError
from tracer.log import LogReader, RecordType, rank_dir
from tracer.log.codec import PayloadError, decode_string

U64 = 2**64 - 1
I32 = 2**31

# (kind, fields, the field named in the error): one event per bounded integer field.
CASES = [
    ("fault", {"microbatch": U64, "site": "layers.0", "elements": 1, "index": [0]}, "microbatch"),
    ("fault", {"microbatch": 0, "elements": 2**63, "index": [0]}, "elements"),
    ("fault", {"microbatch": 0, "elements": 1, "index": [0, U64]}, "index"),
    ("fault", {"microbatch": True, "elements": 1}, "microbatch"),
    ("abft", {"microbatch": 0, "shape": [2, U64, 2]}, "shape"),
    ("abft", {"microbatch": -1, "shape": [2, 2, 2]}, "microbatch"),
    ("loss", {"microbatch": 2**21, "loss": 1.0}, "microbatch"),
    ("step", {"loss": "low", "microbatches": 1}, "loss"),
    ("step", {"loss": 1.0, "microbatches": U64}, "microbatches"),
    ("site_mismatch", {"microbatch": 0, "elements": U64, "mismatched": 1}, "elements"),
    ("site_mismatch", {"microbatch": 0, "elements": 4, "mismatched": -2}, "mismatched"),
    ("replay_divergence", {"microbatch": 0, "expected": -1, "found": 0}, "expected"),
    ("sharpness", {"microbatch": 0, "iterations": 2**63}, "iterations"),
    ("finetune_eval", {"examples": U64, "correct": 1}, "examples"),
    ("finetune_prediction", {"example": 0, "predicted": I32, "answer": 0}, "predicted"),
    ("finetune_prediction", {"example": 0, "predicted": 0, "answer": -1}, "answer"),
    ("checkpoint", {"rank": 2**20}, "rank"),
    ("resume", {"rank": 0, "last_step": 2**41}, "last_step"),
    ("rng", {"fingerprint": 1, "devices": 2**16, "stored": False}, "devices"),
    ("guard", {"accepted": U64, "runs": []}, "accepted"),
    ("guard", {"runs": [{"attempt": 0, "nonfinite": 0, "events": {"fault": U64}}]}, "runs"),
    ("guard", {"runs": [{"attempt": 0, "nonfinite": "none"}]}, "runs"),
    ("guard", {"alarms": [{"detector": "loss_spike", "measured": "high"}]}, "alarms"),
    ("replicas", {"replicas": [0, 1], "ranks": [U64]}, "ranks"),
    ("replicas", {"measured": "far", "replicas": [0, 1]}, "measured"),
]


@pytest.fixture
def run(pretrained: Path, tmp_path: Path) -> Path:
    shutil.copytree(pretrained, tmp_path / "run")
    return tmp_path / "run"


def craft_event(run: Path, kind: str, fields: dict) -> int:
    """The run's first EVENT replaced by one of `kind` with `fields`, framed with a valid CRC; its offset."""
    path = segment(run)
    pos, _ = first(path, RecordType.EVENT)
    reframe(path, pos, msgpack.packb({"kind": kind, "step": 0, "fields": fields}))
    return pos


@pytest.mark.parametrize(("kind", "fields", "field"), CASES)
def test_reader_and_inspect_refuse_an_event_field_beyond_its_column(run, capsys, kind, fields, field) -> None:
    pos = craft_event(run, kind, fields)
    with pytest.raises(LogCorruptionError) as err:
        list(LogReader(rank_dir(run, 0)).records())
    assert (err.value.path, err.value.offset) == (str(segment(run)), pos)
    assert err.value.reason.startswith(f"EVENT {kind!r} field 'fields.{field}' must be"), err.value.reason
    said = inspect_error(run, capsys)
    assert f"{segment(run)}: corrupt record at byte {pos}: EVENT {kind!r} field 'fields.{field}'" in said


@pytest.mark.parametrize(("kind", "fields", "field"), [CASES[0], CASES[14], CASES[20]])
def test_diff_refuses_the_same_event_in_one_line(run, tmp_path, capsys, kind, fields, field) -> None:
    pos = craft_event(run, kind, fields)
    assert main(["diff", "--golden", str(run), "--suspect", str(run), "--db", str(tmp_path / "s.duckdb")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sdc: error: ") and err.count("\n") == 1, err
    assert f"{segment(run)}" in err and f"byte {pos}" in err and f"field 'fields.{field}'" in err, err


def test_events_within_their_bounds_still_read(run) -> None:
    """The largest values the columns hold, and nil where a field may be nil, are data."""
    pos = craft_event(run, "fault", {"microbatch": None, "elements": 2**63 - 1, "index": [2**63 - 1], "site": 3})
    (event,) = [r for r in LogReader(rank_dir(run, 0)).entries() if r.offset == pos]
    assert event.record.fields["elements"] == 2**63 - 1


def test_a_payload_nested_past_msgpacks_stack_says_so_rather_than_nothing():
    # msgpack's StackError has an empty message: the reason used to read "payload is not valid msgpack: ".
    deep = b"\x91" * 5000 + b"\x00"  # 5000 one-element arrays around a 0
    with pytest.raises(PayloadError, match="nested too deeply"):
        decode_string(deep)
