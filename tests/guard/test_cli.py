"""``sdc record --guard``: the default detectors, the policy, and the stop's one line and exit status."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdc.cli import main
from tests.guard.support import kinds, stuck_logit
from tests.sdc.test_cli import SMALL_ARGS
from tracer.checkpoint import list_checkpoints
from tracer.errors import GuardStop
from tracer.log import LogReader, rank_dir

# A NaN in one logit at step 1: the default NonFinite detector fires without any history.
NAN_AT_1 = (
    '[[fault]]\nops = ["matmul"]\nsites = "output"\nphases = ["forward"]\nsteps = [1]\nkind = "stuck"\n'
    "value = nan\npersistent = true\n"
)


def test_record_guard_stop_checkpoints_and_exits_with_its_own_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nan.toml").write_text(NAN_AT_1, encoding="utf-8")
    out = tmp_path / "run"
    args = [
        "record",
        "--out",
        str(out),
        "--steps",
        "3",
        "--quiet",
        "--fault-profile",
        str(tmp_path / "nan.toml"),
        "--checkpoint-every",
        "0",
        *SMALL_ARGS,
    ]
    assert main([*args, "--guard", "stop"]) == GuardStop.exit_code == 3
    # The default detectors' warm-up, said once; the fault is in the LM head, which no default site holds: said
    # once as untraced; then the guard's one error line.
    warning, untraced, err = capsys.readouterr().err.strip().split("\n")
    assert warning.startswith("sdc: warning: the guard's spike detectors") and "loss_spike (the first 8" in warning
    assert untraced.startswith("sdc: warning: a fault hit aten.mm.default in module output, which no traced site")
    assert err.startswith("sdc: error: step 1: the guard stopped training (deterministic: non_finite")
    assert list_checkpoints(out) == [1]
    (event,) = kinds(out, "guard")
    assert (event.step, event.fields["action"]) == (1, "stop")
    header = LogReader(rank_dir(out, 0)).header
    assert header.extra["guard"]["on_deterministic"] == "stop"
    assert [d["name"] for d in header.extra["guard"]["detectors"]] == ["non_finite", "loss_spike", "grad_norm_spike"]


def test_record_guard_skip_trains_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = stuck_logit(tmp_path, 1, persistent=True)
    out = tmp_path / "run"
    assert (
        main(
            [
                "record",
                "--out",
                str(out),
                "--steps",
                "3",
                "--quiet",
                "--fault-profile",
                profile.path,
                "--abft",
                "--guard",
                "skip",
                *SMALL_ARGS,
            ]
        )
        == 0
    )
    (event,) = kinds(out, "guard")  # the stuck logit is flagged by ABFT: the product no longer matches its checksums
    assert event.step == 1 and event.fields["alarms"][0]["detector"] == "abft_flags"
    assert (event.fields["outcome"], event.fields["action"]) == ("deterministic", "skip")
    assert [e.step for e in kinds(out, "step")] == [0, 1, 2]
