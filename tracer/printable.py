"""Text read from a log or a database, made safe to print on a terminal.

    print(f"first divergence at {printable(site)}")

A crafted log or database can put any character in a name or value. Printed raw, an ANSI escape
sequence recolours or rewrites the terminal, ``\\r`` overwrites the line, and a bidirectional
override shows text in another order than it is. `printable` writes each such character as a
Python-style escape: control characters (Unicode category Cc: C0, DEL, C1) as ``\\n``, ``\\r``,
``\\t`` or ``\\xNN``, and the line and paragraph separators and bidirectional formatting
characters as ``\\uNNNN``. Everything else, backslashes included, is left as it is.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with every character that would drive a terminal escaped (see the module's docstring)."""
    return _UNSAFE.sub(_escape, text)


def printable_lines(text: str, indent: str = "  ") -> str:
    """``text``'s own line breaks kept, every other character `printable` escapes escaped, and each line after the
    first indented by ``indent``: a message in several lines (a module tree) prints as such, and no line of it
    can pass for a line of its own (``sdc: error: ...``)."""
    return f"\n{indent}".join(printable(line) for line in text.split("\n"))


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
