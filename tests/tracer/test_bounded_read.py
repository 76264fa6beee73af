"""tracer/bounded_read.py on real files: every bound refused in one line naming the file, the field and the fix,
before anything is converted; a FIFO or a device is refused without blocking; TOML through the same bounds."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracer.bounded_read import Bounds, digit_key, read_json, read_toml
from tracer.errors import ConfigError

FIX = "write it again"


def _read(path: Path, bounds: Bounds | None = None) -> object:
    return read_json(path, "test file", bounds or Bounds(), FIX, ConfigError)


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened without O_NONBLOCK) fails the test after 10 s instead of hanging it."""

    def hung(*_: object) -> None:
        raise TimeoutError("the read blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"a": 1, "a": 2}', "the key 'a' appears twice"),
        ("[" * 100_000 + "]" * 100_000, "nest more than 32 deep"),
        ('{"n": [' + "9" * 5000 + "]}", "n[0]: an integer of 5,000 digits"),
        ('{"n": -' + "9" * 21 + "}", "n: an integer of 22 digits"),
        ('{"x": 1e400}', "x: the number 1e400 is not a finite"),
        ('{"x": NaN}', "x: NaN is not a finite number"),
        ('{"x": -Infinity}', "x: -Infinity is not a finite number"),
        ('{"x": {"y": "\\ud800"}}', "x.y: the string '\\ud800' holds a lone surrogate"),
        ('{"\\udc00": 1}', "the top level (the key '\\udc00'): the string"),
        ('{"s": "' + "a" * 5000 + '"}', "s: a string of 5,000 characters"),
        ('{"s": "' + "\\u0041" * 4097 + '"}', "a string at character 6 is over 4096 characters"),
        ("[1, 2", "not valid JSON"),
    ],
)
def test_json_beyond_its_bounds_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        _read(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and words in message and message.endswith(f"; {FIX}"), message
    assert "\n" not in message


def test_json_within_its_bounds_reads(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text('{"a": [1, -2.5, "x\\u00e9", null, true], "b": {"c": ' + "9" * 20 + "}}")
    assert _read(path) == {"a": [1, -2.5, "x\u00e9", None, True], "b": {"c": int("9" * 20)}}


def test_bytes_that_are_not_utf8_name_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ConfigError, match=r"in.json: not UTF-8 text \(byte 7\)"):
        _read(path)


@pytest.mark.parametrize("what", ["fifo", "directory", "dev-zero", "missing"])
def test_only_a_regular_file_is_read_and_a_fifo_never_blocks(tmp_path: Path, what: str, no_hang: None) -> None:
    path = tmp_path / "in.json"
    if what == "fifo":
        os.mkfifo(path)  # no writer: a plain open() would block forever
    elif what == "directory":
        path.mkdir()
    elif what == "dev-zero":
        path.symlink_to("/dev/zero")
    words = {
        "fifo": "a FIFO (named pipe), not a regular file",
        "directory": "a directory, not a regular file",
        "dev-zero": "a character device, not a regular file",
        "missing": "no such file",
    }[what]
    with pytest.raises(ConfigError) as info:
        _read(path)
    assert words in str(info.value) and str(path) in str(info.value), str(info.value)


def test_a_file_over_its_kinds_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(ConfigError, match=r"1,203 bytes, more than a test file may hold \(1,000\)"):
        _read(path, Bounds(file_bytes=1000))


@pytest.mark.parametrize(
    "text, words",
    [
        ("a = 1\na = 2\n", "TOML syntax error"),
        ("a = " + "[" * 100 + "]" * 100 + "\n", "nest more than 32 deep"),
        ("a = " + "9" * 5000 + "\n", "an integer of more than 20 digits"),
        ("a = " + "1" * 25 + "\n", "a: an integer of more than 20 digits"),
        ('a = "\\ud800"\n', "TOML syntax error"),
        ('a = "' + "x" * 5000 + '"\n', "a: a string of 5,000 characters"),
    ],
)
def test_toml_beyond_its_bounds_is_one_line(tmp_path: Path, text: str, words: str, no_hang: None) -> None:
    path = tmp_path / "in.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_toml(path, "profile", Bounds(), FIX, ConfigError)
    assert words in str(info.value) and str(info.value).startswith(f"{path}: "), str(info.value)


def test_toml_strings_and_comments_hold_any_brackets_and_digits(tmp_path: Path) -> None:
    path = tmp_path / "in.toml"
    path.write_text('a = "[[[[' + "9" * 40 + '"  # ]]]] ' + "1" * 40 + "\n[t]\nb = [1, [2, 3]]\nc = 1_000\n")
    assert read_toml(path, "profile", Bounds(depth=4), FIX, ConfigError) == {
        "a": "[[[[" + "9" * 40,
        "t": {"b": [1, [2, 3]], "c": 1000},
    }


@pytest.mark.parametrize(
    "key, ok", [("27", True), ("0", True), ("²", False), ("٢٧", False), ("２７", False), ("", False)]
)
def test_keys_that_stand_for_numbers_are_ascii_digits(key: str, ok: bool) -> None:
    assert digit_key(key) is ok
