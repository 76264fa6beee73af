"""Fault profiles: the shipped set loads, and every mistake names file, key and allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults import load_profile, shipped_profiles
from faults.ops import resolve_collectives, resolve_ops
from tests.faults.support import SHIPPED
from tracer.errors import ConfigError
from tracer.log.records import Phase


def test_shipped_profiles_load_with_a_description_and_rules() -> None:
    assert set(shipped_profiles()) == SHIPPED
    for name in SHIPPED:
        profile = load_profile(name)
        assert profile.name == name and profile.description and profile.faults
        assert len(profile.sha256) == 64
        assert profile.header(7) == {"name": name, "sha256": profile.sha256, "seed": 7}


def test_a_profile_loads_by_path_with_defaults(write_profile) -> None:
    profile = write_profile('[[fault]]\nops = ["mm", "aten.bmm", "softmax"]\nkind = "stuck"\nvalue = nan\n')
    (rule,) = profile.faults
    assert profile.name == "test-node" and profile.seed == 0
    assert rule.phases == (Phase.FORWARD, Phase.BACKWARD) and rule.p_call == 1.0 and rule.elements == 1
    assert rule.corruption.kind == "stuck" and rule.corruption.value != rule.corruption.value  # nan
    assert rule.schedule.p_enter == 1.0 and rule.schedule.p_exit == 0.0 and rule.schedule.stop is None


RULE = '[[fault]]\nops = ["matmul"]\nkind = "bitflip"\n'


def test_a_rule_can_target_ranks_and_collectives(write_profile) -> None:
    (rule,) = write_profile('[[fault]]\nops = ["reduce_scatter", "mm"]\nranks = [3, 1]\nkind = "bitflip"\n').faults
    assert rule.ranks == (1, 3)
    assert resolve_collectives(rule.ops) == {"reduce_scatter"} and len(resolve_ops(rule.ops)) == 1
    assert resolve_collectives(["collective"]) == {"all_reduce", "reduce_scatter", "all_gather"}
    assert write_profile(RULE).faults[0].ranks is None  # every rank


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (RULE + "bitz = 3\n", ["unknown key fault[0].bitz", "did you mean fault[0].bits?", "allowed keys in [[fault]]: ops, sites"]),
        (RULE + 'bits = "exp"\n', ["fault[0].bits = 'exp'", '"sign", "exponent", "mantissa", "random" or a bit index']),
        (RULE + "bits = 64\n", ["fault[0].bits = 64", "bit index 0..63"]),
        ('[[fault]]\nops = ["matmul"]\n', ["fault[0].kind is missing", "'bitflip', 'scale', 'stuck'"]),
        ('[[fault]]\nops = ["matmull"]\nkind = "bitflip"\n', ["fault[0].ops", "'matmull'", "matmul, attention, softmax"]),
        ('[[fault]]\nops = []\nkind = "bitflip"\n', ["fault[0].ops = []", "non-empty array of op families"]),
        (RULE + "p_call = 1.5\n", ["fault[0].p_call = 1.5", "a number in [0, 1]"]),
        (RULE + 'p_exit = "often"\n', ["fault[0].p_exit must be a number in [0, 1], found string 'often'"]),
        (RULE + 'phases = ["sideways"]\n', ["fault[0].phases", '"forward" and/or "backward"']),
        (RULE + "factor = 10\n", ['fault[0].factor applies only to kind = "scale"']),
        ('[[fault]]\nops = ["mm"]\nkind = "scale"\nfactor = [10, 1]\n', ["fault[0].factor = [10.0, 1.0]", "0 < low <= high"]),
        ('[[fault]]\nops = ["mm"]\nkind = "stuck"\n', ["fault[0].value is missing", "a number"]),
        (RULE + "elements = 2\nfraction = 0.5\n", ["fault[0].elements and fault[0].fraction both given"]),
        (RULE + "elements = 0\n", ["fault[0].elements = 0", "an integer >= 1"]),
        (RULE + "fraction = 0\n", ["fault[0].fraction = 0", "(0, 1]"]),
        (RULE + 'sites = "layers.("\n', ["fault[0].sites = 'layers.('", "regular expression"]),
        (RULE + "start = 5\nstop = 5\n", ["fault[0].stop = 5", "greater than start = 5"]),
        (RULE + "steps = [1, -2]\n", ["fault[0].steps = [1, -2]", "integers >= 0"]),
        (RULE + "ranks = []\n", ["fault[0].ranks = []", "non-empty array of ranks"]),
        (RULE + 'ranks = ["1"]\n', ["fault[0].ranks must be", "non-empty array of ranks", "found array ['1']"]),
        ("sed = 1\n" + RULE, ["unknown key sed", "did you mean seed?"]),
        ("seed = -1\n" + RULE, ["seed = -1", "an integer >= 0"]),
        ('fault = "all"\n', ["fault must be an array of tables", "[[fault]] sections", "found string 'all'"]),
        (RULE + "kind = 2\n", ["TOML"]),
    ],
)
def test_a_malformed_profile_names_file_key_and_allowed_values(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for fragment in expected:
        assert fragment in message


def test_an_unknown_profile_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="not a shipped fault profile.*bursty-mismatch, healthy-node"):
        load_profile("flaky-node")
