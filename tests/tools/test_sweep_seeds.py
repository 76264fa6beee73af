"""tools/sweep_seeds.py's command line: the seeds it reads and the one line it prints for a mistake (the sweep itself,
on real recordings, is tested beside the fleet-mini study it must agree with: tests/sdc/test_fleet_study.py)."""

from __future__ import annotations

import pytest

from tools.sweep_seeds import main, parse_seeds
from tracer.errors import ConfigError


def test_seeds_are_a_range_or_a_list() -> None:
    assert parse_seeds("1:4") == (1, 2, 3)
    assert parse_seeds("1,4,7") == (1, 4, 7)
    for bad in ("", "4:4", "a:b", "1,1", "-1,2", "1:2:3"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_a_mistake_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "x"]) == 2
    assert main(["--models", "nope", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("sweep-seeds: --seeds") and "--models: nope" in err[1]
