"""The shared TOML loader on small dataclasses of its own: every kind of field, and every error's one line."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from tracer import typed_toml
from tracer.errors import ConfigError
from tracer.typed_toml import INLINE, check, require, toml_field


class Colour(enum.Enum):
    RED = 1
    BLUE = 2


@dataclass(frozen=True)
class Window:
    start: int = 0
    stop: int | None = None

    def __post_init__(self) -> None:
        stop, start = self.stop, self.start
        check(stop is None or stop > start, "stop", lambda at: f"{at}stop = {stop} must exceed {at}start = {start}")


@dataclass(frozen=True)
class Rule:
    name: str = toml_field(expected="a rule name")
    colours: tuple[Colour, ...] = (Colour.RED,)
    size: float | tuple[float, float] = 1.0
    window: Window = field(default_factory=Window, metadata=INLINE)

    def __post_init__(self) -> None:
        require(bool(self.colours), "colours", self.colours, "a non-empty array")


@dataclass(frozen=True)
class Shape:
    kind: Literal["box", "ball"] = "box"
    sides: tuple[int, int] = (1, 2)
    solid: bool = False


@dataclass(frozen=True)
class Everything:
    title: str = ""
    shape: Shape = field(default_factory=Shape)
    rule: tuple[Rule, ...] = ()


def load(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> Everything:
    path = tmp_path / "my.toml"
    path.write_text(text, encoding="utf-8")
    return typed_toml.load(Everything, path, overrides)


def error(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_every_kind_of_field_is_read_by_its_type(tmp_path: Path) -> None:
    got = load(
        tmp_path,
        'title = "t"\n[shape]\nkind = "ball"\nsides = [3, 4]\nsolid = true\n'
        '[[rule]]\nname = "a"\ncolours = ["blue", "red"]\nsize = [2, 3]\nstop = 4\n'
        '[[rule]]\nname = "b"\nsize = 5\n',
    )
    assert got == Everything(
        "t",
        Shape("ball", (3, 4), True),
        (Rule("a", (Colour.BLUE, Colour.RED), (2.0, 3.0), Window(0, 4)), Rule("b", (Colour.RED,), 5.0, Window())),
    )
    assert isinstance(got.rule[1].size, float)
    assert typed_toml.from_dict(Everything, {}, "<dict>") == Everything()


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("titel = 1\n", ["my.toml: unknown key titel (did you mean title?); allowed keys: title, shape, rule"]),
        ("[shape]\nkinds = 1\n", ["unknown key shape.kinds (did you mean shape.kind?); allowed keys in [shape]: kind"]),
        (
            '[[rule]]\nname = "a"\nstrat = 1\n',
            [
                "unknown key rule[0].strat (did you mean rule[0].start?)",
                "allowed keys in [[rule]]: name, colours, size, start, stop",
            ],
        ),
        ("shape = 1\n", ["[shape] must be a table, found integer; write a [shape] header"]),
        ('rule = "x"\n', ["rule must be an array of tables, written as [[rule]] sections, found string 'x'"]),
        (
            "[shape]\nsides = [1]\n",
            ["shape.sides must be an array of 2 integers, found array [1]", "write e.g. shape.sides = [1, 2]"],
        ),
        ("[shape]\nsolid = 1\n", ["shape.solid must be true or false, found integer 1"]),
        ('[shape]\nkind = "cube"\n', ["shape.kind = 'cube' is not one of 'box', 'ball'; pick one of them"]),
        ('[[rule]]\nname = "a"\ncolours = ["green"]\n', ["rule[0].colours must be an array of values, found array"]),
        ('[[rule]]\nname = "a"\ncolours = []\n', ["rule[0].colours = [] must be a non-empty array"]),
        ('[[rule]]\nname = "a"\nsize = "big"\n', ["rule[0].size must be a number or an array of 2 numbers"]),
        ("[[rule]]\nsize = 2\n", ["rule[0].name is missing; set it to a rule name"]),
        ('[[rule]]\nname = "a"\nstart = 3\nstop = 2\n', ["rule[0].stop = 2 must exceed rule[0].start = 3"]),
        ("title = = 1\n", ["TOML syntax error", "line 1"]),
    ],
)
def test_each_mistake_is_one_line_naming_file_and_key(tmp_path: Path, text: str, needles: list[str]) -> None:
    message = error(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'my.toml'}: ")
    for needle in needles:
        assert needle in message, message


def test_overrides_are_typed_and_errors_name_them(tmp_path: Path) -> None:
    got = load(tmp_path, "[shape]\nsolid = true\n", ("shape.kind=ball", "shape.sides=[5, 6]"))
    assert got.shape == Shape("ball", (5, 6), True)
    assert error(tmp_path, "", ("shape.sides=7",)).startswith("override 'shape.sides=7': shape.sides must be")
    assert error(tmp_path, "", ("shap.kind=box",)).startswith("override 'shap.kind=box': unknown key shap")
    assert "must look like section.key=value" in error(tmp_path, "", ("title=x",))
    assert (
        error(tmp_path, 'title = "t"\n', ("title.x=1",))
        == "override 'title.x=1': title is string 't', not a table; override a key of a table"
    )


def test_a_shipped_name_or_a_path(tmp_path: Path) -> None:
    names = {"one": tmp_path / "one.toml"}
    assert typed_toml.resolve("one", names, "widget") == tmp_path / "one.toml"
    with pytest.raises(ConfigError, match="widget 'two' not found: .* not a shipped widget; .* one of: one"):
        typed_toml.resolve("two", names, "widget")
