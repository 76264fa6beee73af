"""One bounded reader for every JSON or TOML file that arrives from elsewhere.

    doc = read_json(path, "tolerance map", Bounds(file_bytes=64 << 20), fix="measure it again", error=ConfigError)
    doc = parse_json(raw, f"{path} line 3", Bounds(), fix, error)   # bytes already read
    data = read_toml(path, "fault profile", Bounds(), fix, ConfigError)
    if not digit_key(key): ...                                      # a key that stands for a number

Incident bundles (manifests, safetensors headers), verdict lines, tolerance maps, study files and fault profiles
are written on other machines, by other people or by no one in particular, so their reader trusts nothing in
them. A file is opened as a regular file only (``O_NONBLOCK``, then ``fstat``: a FIFO never blocks, a device is
never read) and read up to a size cap per kind. Before any value is converted, the text's nesting depth and the
length of every string token are bounded (a scan that keeps no tree, so a file nested 100,000 deep costs one pass,
not a RecursionError); integers are bounded by their digits before ``int()`` sees them, floats must be finite;
duplicate keys are refused, and every decoded string must be valid UTF-8 (no lone surrogate from a ``\\ud800``
escape). Every refusal is one line: ``<file>: <field or what> <problem>; <fix>``, raised as the caller's
`SdcError` subclass, so the CLI prints it as it is.

Standard library only (and `tracer.errors` when sdctrace is installed): an incident bundle carries a copy of this
module beside its ``bundle_check.py`` and ``reproduce.py``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from tracer.errors import SdcError
except ImportError:  # the copy a bundle carries: no sdctrace on this machine

    class SdcError(Exception):  # type: ignore[no-redef]  # the same root, for the bundle's own scripts
        """Root of every error the bundle's scripts raise on purpose."""


@dataclass(frozen=True)
class Bounds:
    """What one kind of file may hold; refused past any of these before a value is converted."""

    file_bytes: int = 16 << 20
    depth: int = 32  # arrays and objects in one another
    text: int = 4096  # characters of one string or key
    int_digits: int = 20  # an integer fits in int64 (a seed, a size, a count)
    finite: bool = True  # False: nan and inf are values (TOML's own words, e.g. a fault profile's NaN)


FILE_KINDS = (  # what a path that is not a regular file is, as a refusal names it
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# A JSON string token (escapes kept) or a bracket: what the depth scan walks, strings skipped whole.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _fail(error: type[Exception], source: Path | str, problem: str, fix: str) -> Exception:
    return error(f"{source}: {problem}; {fix}")


def read_bytes(path: Path | str, what: str, limit: int, fix: str, error: type[Exception] = SdcError) -> bytes:
    """All bytes of the regular file ``path`` (symlinks followed), refused when over ``limit`` bytes before a byte
    is read. A FIFO, a device, a socket or a directory is refused, never read (and a FIFO never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise _fail(error, path, f"no such file (the {what})", fix) from None
    except OSError as exc:
        raise _fail(error, path, f"cannot read the {what} ({exc.strerror or exc})", fix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in FILE_KINDS if test(st.st_mode)), "not a regular file")
            raise _fail(error, path, f"the {what} is {kind}, not a regular file", f"put a regular file there; {fix}")
        if st.st_size > limit:
            raise _fail(error, path, f"{st.st_size:,} bytes, more than a {what} may hold ({limit:,})", fix)
        chunks, left = [], min(st.st_size, limit) + 1  # one byte past the cap: a file that grew is refused
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise _fail(error, path, f"cannot read the {what} ({exc.strerror or exc})", fix) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise _fail(error, path, f"the {what} grew past the {limit:,} bytes it may have while read", fix)
    return data


def _text(data: bytes, source: Path | str, fix: str, error: type[Exception]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(error, source, f"not UTF-8 text (byte {exc.start})", fix) from None


def _scan(text: str, source: Path | str, bounds: Bounds, fix: str, error: type[Exception]) -> None:
    """Depth and string-token length of JSON text, before it is parsed (no tree, no recursion)."""
    depth, longest = 0, 6 * bounds.text + 2  # a character is at most 6 in JSON text (\\uXXXX), plus the quotes
    for m in _TOKENS.finditer(text):
        c = text[m.start()]
        if c == '"':
            if m.end() - m.start() > longest:
                raise _fail(error, source, f"a string at character {m.start()} is over {bounds.text} characters", fix)
        elif c in "[{":
            depth += 1
            if depth > bounds.depth:
                raise _fail(error, source, f"arrays and objects nest more than {bounds.depth} deep", fix)
        else:
            depth -= 1


def parse_json(data: bytes, source: Path | str, bounds: Bounds, fix: str, error: type[Exception] = SdcError) -> Any:
    """The JSON value of ``data``, every bound of ``bounds`` checked (the module docstring); one-line ``error``."""
    text = _text(data, source, fix, error)
    _scan(text, source, bounds, fix, error)

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"the key {key[:80]!r} appears twice in one object")
            out[key] = value
        return out

    def bounded_int(digits: str) -> Any:
        if len(digits.lstrip("-")) > bounds.int_digits:  # never converted: check_tree names its field
            return _Refused(f"an integer of {len(digits):,} digits, more than the {bounds.int_digits} allowed")
        return int(digits)

    def finite(digits: str) -> Any:
        value = float(digits[:400])
        if len(digits) > 400 or not math.isfinite(value):
            return _Refused(f"the number {digits[:40]} is not a finite 64-bit float")
        return value

    try:
        value = json.loads(text, object_pairs_hook=unique, parse_int=bounded_int, parse_float=finite,
                           parse_constant=_Refused.constant)  # fmt: skip
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else "nested too deep"
        raise _fail(error, source, f"not valid JSON ({reason})", fix) from None
    check_tree(value, source, bounds, fix, error)
    return value


class _Refused:
    """A number the parser did not convert (too many digits, not finite, NaN): `check_tree` refuses it, naming
    its field."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    @classmethod
    def constant(cls, word: str) -> _Refused:
        return cls(f"{word} is not a finite number")


def check_tree(value: Any, source: Path | str, bounds: Bounds, fix: str, error: type[Exception] = SdcError) -> None:
    """Depth, string lengths (keys too) and UTF-8 of a decoded value, walked without recursion; integers within
    ``bounds.int_digits`` digits, floats finite (a TOML value is checked here after tomllib). A refusal names the
    field (``places[3].band``)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        problem = _problem(v, bounds)
        if problem is None and isinstance(v, (list, dict)):
            if depth >= bounds.depth:
                problem = f"arrays and objects nest more than {bounds.depth} deep"
            elif isinstance(v, dict):
                bad = next((k for k in v if _problem(k, bounds)), None)
                if bad is not None:
                    field = _field(value, v) + f" (the key {bad[:40]!r})"
                    raise _fail(error, source, f"{field}: {_problem(bad, bounds)}", fix)
                stack.extend((x, depth + 1) for x in v.values())
            else:
                stack.extend((x, depth + 1) for x in v)
        if problem is not None:
            raise _fail(error, source, f"{_field(value, v)}: {problem}", fix)


def _problem(v: Any, bounds: Bounds) -> str | None:
    """What is wrong with the leaf ``v`` by itself, or None."""
    if isinstance(v, _Refused):
        return v.reason
    if isinstance(v, str):
        if len(v) > bounds.text:
            return f"a string of {len(v):,} characters, more than {bounds.text}"
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return f"the string {v[:40]!r} holds a lone surrogate (not valid UTF-8)"
    elif isinstance(v, int) and not isinstance(v, bool):
        if abs(v) >= 10**bounds.int_digits:
            return f"an integer of more than {bounds.int_digits} digits"
    elif isinstance(v, float) and bounds.finite and not math.isfinite(v):
        return f"the number {v} is not finite"
    return None


def _field(root: Any, target: Any) -> str:
    """The path from ``root`` to the object ``target`` (``places[3].band``; ``the top level`` for root itself)."""
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        v, path = stack.pop()
        if v is target:
            return path or "the top level"
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{_key(k)}" if path else _key(k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
    return "a value"


def _key(key: Any) -> str:
    """A key as a refusal names it: on one line, safe to print (control and non-ASCII characters escaped: this
    module stands alone in a bundle, without tracer.printable), at most 40 characters of it."""
    text = str(key)
    return text[:40].encode("unicode_escape").decode("ascii") + ("..." if len(text) > 40 else "")


def read_json(path: Path | str, what: str, bounds: Bounds, fix: str, error: type[Exception] = SdcError) -> Any:
    """`parse_json` of the regular file ``path``, at most ``bounds.file_bytes`` bytes."""
    return parse_json(read_bytes(path, what, bounds.file_bytes, fix, error), path, bounds, fix, error)


def parse_toml(text: str, source: Path | str, bounds: Bounds, fix: str, error: type[Exception] = SdcError) -> Any:
    """TOML text as a dict: tomllib refuses duplicate keys and surrogate escapes itself; nesting is bounded before
    it parses (by brackets outside strings), integers by their digits, and the result as `check_tree`."""
    code = _toml_code(text)
    digits = re.search(r"(?<![\w.\"'])[+-]?[0-9_]{" + str(bounds.int_digits + 8) + r",}(?![\w.])", code)
    if digits:
        raise _fail(error, source, f"an integer of more than {bounds.int_digits} digits ({digits[0][:30]}...)", fix)
    depth = 0
    for c in re.findall(r"[\[\]{}]", code):
        depth += 1 if c in "[{" else -1
        if depth > bounds.depth:
            raise _fail(error, source, f"arrays and inline tables nest more than {bounds.depth} deep", fix)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _fail(error, source, f"TOML syntax error: {exc}", fix) from None
    except (ValueError, RecursionError) as exc:
        raise _fail(error, source, f"unreadable TOML ({str(exc)[:100] or 'nested too deep'})", fix) from None
    check_tree(data, source, bounds, fix, error)
    return data


def _toml_code(text: str) -> str:
    """TOML text with its strings and comments blanked out (a rough cut: enough to count brackets and digits)."""
    return re.sub(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*', '""', text)


def read_toml(path: Path | str, what: str, bounds: Bounds, fix: str, error: type[Exception] = SdcError) -> Any:
    """`parse_toml` of the regular file ``path``, at most ``bounds.file_bytes`` bytes."""
    data = read_bytes(path, what, bounds.file_bytes, fix, error)
    return parse_toml(_text(data, path, fix, error), path, bounds, fix, error)


def digit_key(key: Any) -> bool:
    """Whether ``key`` is a number written in ASCII digits (``"12"``): never ``"²"``, ``"١"`` or ``"１"``, which
    ``str.isdigit`` accepts and ``int()`` reads or refuses."""
    return isinstance(key, str) and 0 < len(key) <= 20 and key.isascii() and key.isdigit()
