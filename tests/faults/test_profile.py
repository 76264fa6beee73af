"""Fault profiles: the shipped set loads, and every mistake names file, key and allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults import load_profile, profile_from_header, shipped_profiles
from faults.ops import resolve_collectives, resolve_ops
from faults.profile import RulePhase
from tests.faults.support import SHIPPED
from tracer.errors import ConfigError, ValidationError
from tracer.log import SCHEMA_VERSION, LogReader, LogWriter, RunHeader, rank_dir


def test_shipped_profiles_load_with_a_description_and_rules() -> None:
    assert set(shipped_profiles()) == SHIPPED
    for name in SHIPPED:
        profile = load_profile(name)
        assert profile.name == name and profile.description and profile.faults
        assert len(profile.sha256) == 64
        assert profile.header(7) == {"name": name, "sha256": profile.sha256, "seed": 7, "profile": profile.data}


def test_a_profile_loads_by_path_with_defaults(write_profile) -> None:
    profile = write_profile('[[fault]]\nops = ["mm", "aten.bmm", "softmax"]\nkind = "stuck"\nvalue = nan\n')
    (rule,) = profile.faults
    assert profile.name == "test-node" and profile.seed == 0
    assert rule.phases == (RulePhase.FORWARD, RulePhase.BACKWARD) and rule.p_call == 1.0 and rule.elements == 1
    assert rule.corruption.kind == "stuck" and rule.corruption.value != rule.corruption.value  # nan
    assert rule.schedule.p_enter == 1.0 and rule.schedule.p_exit == 0.0 and rule.schedule.stop is None


RULE = '[[fault]]\nops = ["matmul"]\nkind = "bitflip"\n'


def test_a_rule_can_target_ranks_and_collectives(write_profile) -> None:
    (rule,) = write_profile('[[fault]]\nops = ["reduce_scatter", "mm"]\nranks = [3, 1]\nkind = "bitflip"\n').faults
    assert rule.ranks == (1, 3)
    assert resolve_collectives(rule.ops) == {"reduce_scatter"} and len(resolve_ops(rule.ops)) == 1
    assert resolve_collectives(["collective"]) == {
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "all_to_all",
        "send",
        "recv",
    }
    assert write_profile(RULE).faults[0].ranks is None  # every rank


def test_a_rule_can_name_microbatches(write_profile) -> None:
    assert write_profile(RULE + "microbatches = [2, 0, 2]\n").faults[0].microbatches == (0, 2)
    assert write_profile(RULE).faults[0].microbatches is None  # every microbatch


def test_a_rule_can_name_the_attempts_of_a_step_it_fires_in(write_profile) -> None:
    assert write_profile(RULE + "attempts = [0]\n").faults[0].attempts == (0,)  # the first run only
    assert write_profile(RULE).faults[0].attempts is None  # the first run and every re-run


def test_a_rule_can_name_the_optimizer_phase(write_profile) -> None:
    rule = write_profile(RULE + 'phases = ["optimizer", "forward"]\n').faults[0]
    assert rule.phases == (RulePhase.FORWARD, RulePhase.OPTIMIZER)  # in step order
    profile = write_profile(
        '[[fault]]\nops = ["_foreach_addcdiv_"]\nphases = ["optimizer"]\nkind = "scale"\nfactor = 2.0\n'
    )
    assert profile.faults[0].phases == (RulePhase.OPTIMIZER,) and profile.data["fault"][0]["phases"] == ["optimizer"]


def test_a_rule_is_transient_unless_persistent(write_profile) -> None:
    assert write_profile(RULE).faults[0].persistent is False
    assert write_profile(RULE + "persistent = true\n").faults[0].persistent is True


# Every key a rule may hold, with values other than the defaults.
CUSTOM = """
description = "every key"
seed = 11
[[fault]]
ops = ["mm", "softmax"]
sites = "layers\\\\.0\\\\..*"
phases = ["backward"]
p_call = 0.25
fraction = 0.5
kind = "scale"
factor = [2, 8.5]
p_enter = 0.5
p_exit = 0.75
start = 1
stop = 9
steps = [3, 2]
ranks = [1]
microbatches = [1, 0]
persistent = true
[[fault]]
ops = ["collective"]
elements = 3
kind = "stuck"
value = -inf
[[fault]]
ops = ["matmul"]
kind = "bitflip"
bits = 7
"""


def through_a_log(tmp_path: Path, recorded: dict) -> dict:
    """``recorded`` as a run header's extra["fault_profile"] stores it: written to a real log and read back."""
    header = RunHeader(
        SCHEMA_VERSION,
        "run-1",
        "node",
        "train",
        1,
        0,
        {},
        "cfg",
        0,
        "data",
        "fp",
        {},
        "cpu",
        {},
        0.0,
        {"fault_profile": recorded},
    )
    out = rank_dir(tmp_path / recorded["name"], 0)
    LogWriter(out, header).close()
    return LogReader(out).header.extra["fault_profile"]


def test_a_header_rebuilds_the_profile_it_records(tmp_path: Path, write_profile) -> None:
    profiles = [load_profile(name) for name in sorted(SHIPPED)] + [write_profile(CUSTOM, name="my-node")]
    for profile in profiles:
        rebuilt = profile_from_header(through_a_log(tmp_path, profile.header(3)))
        assert rebuilt == profile and rebuilt.faults == profile.faults, profile.name
        assert rebuilt.path == "fault profile 'my-node' in the run header" or profile.name != "my-node"
    assert profiles[-1].faults[0].microbatches == (0, 1) and profiles[-1].faults[2].corruption.bits == 7


def test_a_tampered_header_is_refused(write_profile) -> None:
    recorded = write_profile(CUSTOM, name="my-node").header(0)
    changed = {**recorded, "profile": {**recorded["profile"], "seed": 12}}
    with pytest.raises(ValidationError, match=r"^fault profile 'my-node' in the run header: fault_profile.sha256 = "):
        profile_from_header(changed)
    with pytest.raises(ValidationError, match="fault_profile.sha256"):
        profile_from_header({**recorded, "sha256": "0" * 64})
    with pytest.raises(ValidationError, match="fault_profile.profile is missing"):
        profile_from_header({k: v for k, v in recorded.items() if k != "profile"})
    broken = {**recorded, "profile": {**recorded["profile"], "sed": 1}}
    with pytest.raises(ConfigError, match="^fault profile 'my-node' in the run header: unknown key sed"):
        profile_from_header(broken)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            RULE + "bitz = 3\n",
            ["unknown key fault[0].bitz", "did you mean fault[0].bits?", "allowed keys in [[fault]]: ops, sites"],
        ),
        (RULE + 'bits = "exp"\n', ["fault[0].bits = 'exp'", '"sign", "exponent", "mantissa", "random" or a bit index']),
        (RULE + "bits = 64\n", ["fault[0].bits = 64", "bit index 0..63"]),
        ('[[fault]]\nops = ["matmul"]\n', ["fault[0].kind is missing", "'bitflip', 'scale', 'stuck'"]),
        (
            '[[fault]]\nops = ["matmull"]\nkind = "bitflip"\n',
            ["fault[0].ops", "'matmull'", "matmul, attention, softmax"],
        ),
        ('[[fault]]\nops = []\nkind = "bitflip"\n', ["fault[0].ops = []", "non-empty array of op families"]),
        (RULE + "p_call = 1.5\n", ["fault[0].p_call = 1.5", "a number in [0, 1]"]),
        (RULE + 'p_exit = "often"\n', ["fault[0].p_exit must be a number in [0, 1], found string 'often'"]),
        (RULE + 'phases = ["sideways"]\n', ["fault[0].phases", 'some of "forward", "backward", "optimizer"']),
        (RULE + "phases = []\n", ["fault[0].phases = []", 'some of "forward", "backward", "optimizer"']),
        (
            RULE + 'sites = "1"\nphases = ["forward", "optimizer"]\n',
            ["fault[0].sites names module paths", 'put the "optimizer" phase in a rule of its own'],
        ),
        (RULE + "factor = 10\n", ['fault[0].factor applies only to kind = "scale"']),
        (
            '[[fault]]\nops = ["mm"]\nkind = "scale"\nfactor = [10, 1]\n',
            ["fault[0].factor = [10.0, 1.0]", "0 < low <= high"],
        ),
        ('[[fault]]\nops = ["mm"]\nkind = "stuck"\n', ["fault[0].value is missing", "a number"]),
        (RULE + "elements = 2\nfraction = 0.5\n", ["fault[0].elements and fault[0].fraction both given"]),
        (RULE + "elements = 0\n", ["fault[0].elements = 0", "an integer >= 1"]),
        (RULE + "fraction = 0\n", ["fault[0].fraction = 0", "(0, 1]"]),
        (RULE + 'sites = "layers.("\n', ["fault[0].sites = 'layers.('", "regular expression"]),
        (RULE + "start = 5\nstop = 5\n", ["fault[0].stop = 5", "greater than start = 5"]),
        (RULE + "steps = [1, -2]\n", ["fault[0].steps = [1, -2]", "integers >= 0"]),
        (RULE + "ranks = []\n", ["fault[0].ranks = []", "non-empty array of ranks"]),
        (RULE + "microbatches = []\n", ["fault[0].microbatches = []", "non-empty array of microbatch indices"]),
        (RULE + "attempts = [-1]\n", ["fault[0].attempts = [-1]", "non-empty array of attempts"]),
        (RULE + 'ranks = ["1"]\n', ["fault[0].ranks must be", "non-empty array of ranks", "found array ['1']"]),
        (RULE + 'persistent = "yes"\n', ["fault[0].persistent must be true or false, found string 'yes'"]),
        ("sed = 1\n" + RULE, ["unknown key sed", "did you mean seed?"]),
        ("seed = -1\n" + RULE, ["seed = -1", "an integer >= 0"]),
        ('fault = "all"\n', ["fault must be an array of tables", "[[fault]] sections", "found string 'all'"]),
        (RULE + "kind = 2\n", ["TOML"]),
    ],
)
def test_a_malformed_profile_names_file_key_and_allowed_values(tmp_path: Path, text: str, expected: list[str]) -> None:
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
