"""Read a TOML file (or a dict) into nested frozen dataclasses, by their type hints.

    cfg = load(Config, Path("my.toml"), overrides=["model.dim=256"])
    cfg = from_dict(Config, {"model": {"dim": 256}}, source="<dict>")

A dataclass is a table: each field a key, its type hint what the value must be (int, float,
bool, str, Literal, an Enum by lower-case member name, tuple and list, ``X | None`` and other
unions, a nested dataclass as a table, a tuple of dataclasses as an array of tables). A
`toml_field` can describe valid values for the errors, or take a nested dataclass's keys from
the enclosing table (`INLINE`). Values are checked by the dataclasses' own ``__post_init__``,
which raises `InvalidValue` with the key; the loader adds where that key sits and where its
value came from.

Every mistake fails here, as one line naming the file (or the ``--set`` override the value
came from), the dotted key and the fix: a config that silently took a default for a misspelled
key would make two "identical" runs differ, or a faulty node look healthy. The workload
config, the fault profiles and the study files are all read this way.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import math
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

from tracer.bounded_read import Bounds, parse_toml, read_bytes
from tracer.errors import ConfigError

T = TypeVar("T")
Origin = Callable[[str], str]  # dotted key -> where its value came from: the file, or an override


class InvalidValue(ConfigError):
    """Raised by a dataclass's ``__post_init__``: ``key`` is relative to that dataclass, and
    ``message(at)`` says what is wrong with every key it names prefixed by ``at`` (``"model."``)."""

    def __init__(self, key: str, message: Callable[[str], str]) -> None:
        self.key = key
        self.message = message
        super().__init__(message(""))


def check(ok: bool, key: str, message: Callable[[str], str]) -> None:
    """Raise `InvalidValue` unless ``ok``; ``message(at)`` names each key it mentions as ``{at}key``."""
    if not ok:
        raise InvalidValue(key, message)


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """Refuse ``key = value`` unless ``ok``, saying what it must be (``>= 1``, ``a number in [0, 1]``)."""
    if not ok:
        raise InvalidValue(key, lambda at: f"{at}{key} = {shown(value)} must be {expected}")


def expected(cls: type, key: str) -> str:
    """How the errors describe a valid value of field ``key``: its `toml_field` text, else its type."""
    return _fields(cls)[key].metadata.get("expected") or _describe(typing.get_type_hints(cls)[key], key)


def toml_field(default: Any = dataclasses.MISSING, *, expected: str) -> Any:
    """A dataclass field whose valid values its type hint cannot say: ``expected`` says them in errors."""
    return dataclasses.field(default=default, metadata={"expected": expected})


# Field metadata of a nested dataclass whose keys sit in the enclosing table, not in a sub-table.
INLINE = types.MappingProxyType({"inline": True})


def shipped(package: str, folder: str) -> dict[str, Path]:
    """Name -> path of every ``.toml`` file that ships in ``package/folder``."""
    found = resources.files(package) / folder
    return {
        p.name.removesuffix(".toml"): Path(str(p))
        for p in sorted(found.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".toml")
    }


def resolve(spec: str | Path, names: Mapping[str, Path], what: str) -> Path:
    """A shipped file by name, or a path to one of the user's."""
    if isinstance(spec, str) and spec in names:
        return names[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"{what} {str(spec)!r} not found: no such file, and not a shipped {what}; "
            f"pass a path to a TOML file or one of: {', '.join(names)}"
        )
    return path


MAX_NESTING = 64  # tables and arrays in one another: a config nests a few levels; tomllib recurses on each
MAX_BYTES = 16 << 20  # a profile, a study or a config: kilobytes
MAX_TEXT = 1 << 16  # characters of one string (a fault rule's module path, a note)
TOML_BOUNDS = Bounds(file_bytes=MAX_BYTES, depth=MAX_NESTING, text=MAX_TEXT, int_digits=20, finite=False)


def read(path: Path) -> dict[str, Any]:
    """The parsed file, read through tracer/bounded_read.py (a regular file of at most MAX_BYTES, never a FIFO);
    a syntax or encoding error, a duplicate key, or nesting past MAX_NESTING names the file (and its line)."""
    data = read_bytes(path, "TOML file", MAX_BYTES, "give a TOML file (a profile, a study, a config)", ConfigError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e}); save it as UTF-8") from None
    return parse(text, str(path))


def parse(text: str, source: str) -> dict[str, Any]:
    """TOML text as a dict, or one `ConfigError` naming ``source``: tomllib's own syntax errors, and what
    tracer/bounded_read.py refuses before tomllib converts a value (an integer of thousands of digits, nesting
    past MAX_NESTING, a string over MAX_TEXT characters)."""
    return parse_toml(text, source, TOML_BOUNDS, "fix that line", ConfigError)


def load(cls: type[T], path: Path, overrides: Sequence[str] = ()) -> T:
    """Read ``path``, apply ``section.key=value`` overrides, and build ``cls``."""
    raw = read(path)
    origins = apply_overrides(raw, overrides)
    return from_dict(cls, raw, str(path), origins)


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, str]:
    """Set each ``section.key=value`` in ``raw`` (the value parsed as TOML, a bare word as a string);
    returns which dotted keys (and new tables) each override supplied, for the errors."""
    origins: dict[str, str] = {}
    for override in overrides:
        dotted, sep, text = override.partition("=")
        parts = dotted.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise ConfigError(f"override {override!r} must look like section.key=value, e.g. model.dim=256")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()  # a bare word such as `sgd`: a string
        except (ValueError, RecursionError):  # thousands of digits, or nesting
            raise ConfigError(
                f"override {override!r}: its value is too long an integer or nests too deep for "
                "TOML; write a 64-bit integer, nested a few levels at most"
            ) from None
        table = raw
        for i, part in enumerate(parts[:-1]):
            if part not in table:
                origins[".".join(parts[: i + 1])] = f"override {override!r}"
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(
                    f"override {override!r}: {'.'.join(parts[: i + 1])} is {_kind(table)} "
                    f"{table!r}, not a table; override a key of a table"
                )
        table[parts[-1]] = value
        origins[".".join(parts)] = f"override {override!r}"
    return origins


def from_dict(cls: type[T], raw: Mapping[str, Any], source: str, origins: Mapping[str, str] | None = None) -> T:
    """Build ``cls`` from parsed TOML (or JSON) data; errors name ``source`` unless ``origins`` names
    the override a key came from."""
    found = dict(origins or {})
    return _table(cls, raw, "", lambda key: found.get(key, source))


class _WrongType(Exception):
    """A value that is not of its field's type; the caller words the error."""


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _keys(cls: type) -> list[str]:
    """The keys a table of ``cls`` may hold, inline dataclasses' keys in their place."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for name, f in _fields(cls).items():
        out += _keys(hints[name]) if f.metadata.get("inline") else [name]
    return out


def _table(cls: type[T], raw: Mapping[str, Any], path: str, origin: Origin, label: str = "") -> T:
    at = f"{path}." if path else ""
    allowed = _keys(cls)
    hints = typing.get_type_hints(cls)
    sections = not path and all(dataclasses.is_dataclass(h) for h in hints.values())
    for name in raw:
        if name in allowed:
            continue
        close = difflib.get_close_matches(str(name), allowed, n=1)
        if sections:
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{origin(name)}: unknown section [{name}]{hint}; allowed sections: {', '.join(allowed)}")
        hint = f" (did you mean {at}{close[0]}?)" if close else ""
        where = f" in {label}" if label else ""
        raise ConfigError(
            f"{origin(at + str(name))}: unknown key {at}{name}{hint}; allowed keys{where}: {', '.join(allowed)}"
        )
    return _build(cls, raw, path, origin)


def _build(cls: type[T], raw: Mapping[str, Any], path: str, origin: Origin) -> T:
    """``cls`` from the keys of ``raw`` it owns (they were checked), then its own validation."""
    at = f"{path}." if path else ""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in _fields(cls).items():
        key = at + name
        if f.metadata.get("inline"):
            kwargs[name] = _build(hints[name], raw, path, origin)
        elif name in raw:
            kwargs[name] = _value(hints[name], raw[name], key, f, origin)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{origin(key)}: {key} is missing; set it to {expected(cls, name)}")
    try:
        built = cls(**kwargs)
    except InvalidValue as e:
        raise ConfigError(f"{origin(at + e.key)}: {e.message(at)}") from None
    for name, value in kwargs.items():  # after the dataclass's own bounds, which say more where it has them
        big = _beyond_int64(value)
        if big is not None:
            raise ConfigError(
                f"{origin(at + name)}: {at}{name} holds the integer {big:.3g}, beyond the 64-bit "
                f"integers TOML holds ({INT64_MIN}..{INT64_MAX}) and torch and numpy take; write a "
                "smaller one"
            )
    return built


def _value(hint: Any, value: Any, key: str, f: dataclasses.Field, origin: Origin) -> Any:
    """``value`` as the field's type, or a one-line error: expected vs found, and what to write."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{origin(key)}: [{key}] must be a table, found {_kind(value)}; "
                f"write a [{key}] header with keys under it"
            )
        return _table(hint, value, key, origin, f"[{key}]")
    if _is_tables(hint):
        (element, _) = typing.get_args(hint)
        if isinstance(value, (list, tuple)) and all(isinstance(v, Mapping) for v in value):
            return tuple(_table(element, v, f"{key}[{i}]", origin, f"[[{key}]]") for i, v in enumerate(value))
    elif typing.get_origin(hint) is Literal and isinstance(value, str) and value not in typing.get_args(hint):
        raise ConfigError(
            f"{origin(key)}: {key} = {value!r} is not one of "
            f"{', '.join(map(repr, typing.get_args(hint)))}; pick one of them"
        )
    else:
        try:
            return _coerce(hint, value)
        except _WrongType:
            pass
    wanted = f.metadata.get("expected") or _describe(hint, key)
    known = f.default is not dataclasses.MISSING and f.default is not None and not _is_tables(hint)
    example = f"; write e.g. {key} = {toml_value(f.default)}" if known else ""
    raise ConfigError(f"{origin(key)}: {key} must be {wanted}, found {_kind(value)} {value!r}{example}")


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # TOML's integers; tomllib reads larger ones without a word


def _beyond_int64(value: Any) -> int | None:
    """The first integer in ``value`` (a scalar or an array) outside INT64_MIN..INT64_MAX, or None."""
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
            return v
    return None


def _coerce(hint: Any, value: Any) -> Any:
    kind = typing.get_origin(hint)
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif kind is Literal:
        ok = isinstance(value, str) and value in typing.get_args(hint)
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        ok = isinstance(value, str) and value.upper() in hint.__members__ and value == value.lower()
        value = hint[value.upper()] if ok else value
    elif kind in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for option in (a for a in typing.get_args(hint) if a is not type(None)):
            try:
                return _coerce(option, value)
            except _WrongType:
                continue
        ok = False
    elif kind in (tuple, list):
        args = typing.get_args(hint)
        ok = isinstance(value, (list, tuple))
        items = args[:1] * len(value) if ok and (kind is list or args[1:] == (Ellipsis,)) else args
        ok = ok and len(items) == len(value)
        if ok:
            value = kind(_coerce(h, v) for h, v in zip(items, value))
    else:
        raise TypeError(f"typed_toml cannot read fields of type {hint!r}")  # a bug in the dataclass, not the user's
    if not ok:
        raise _WrongType
    return value


def _is_tables(hint: Any) -> bool:
    args = typing.get_args(hint)
    return (
        typing.get_origin(hint) is tuple
        and len(args) == 2
        and args[1] is Ellipsis
        and dataclasses.is_dataclass(args[0])
    )


def _describe(hint: Any, key: str = "") -> str:
    """What a value of this type looks like, in the words of a TOML user."""
    kind, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return "a table"
    if _is_tables(hint):
        return f"an array of tables, written as [[{key.rsplit('.', 1)[-1]}]] sections"
    if kind is Literal:
        return f"one of {', '.join(map(repr, args))}"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"one of {', '.join(repr(m.lower()) for m in hint.__members__)}"
    if kind in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if kind in (tuple, list):
        if kind is list or args[1:] == (Ellipsis,):
            return f"an array of {_PLURAL.get(args[0], 'values')}"
        if len(set(args)) == 1:
            return f"an array of {len(args)} {_PLURAL.get(args[0], 'values')}"
        return f"an array of {len(args)} values"
    return _SINGULAR.get(hint, repr(hint))


_SINGULAR = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def toml_value(value: Any) -> str:
    """``value`` as it would be written in TOML (tuples as arrays, enums by lower-case name)."""
    if isinstance(value, enum.Enum):
        return json.dumps(value.name.lower())
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return json.dumps(value)


def shown(value: Any) -> str:
    """``value`` as an error quotes what was found: as parsed (tuples as lists, enums by lower-case name)."""

    def plain(v: Any) -> Any:
        if isinstance(v, enum.Enum):
            return v.name.lower()
        return [plain(x) for x in v] if isinstance(v, (tuple, list)) else v

    return repr(plain(value))


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )
