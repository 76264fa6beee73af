"""Print the project's requirements from pyproject.toml, one a line, leaving some out.

``make test-xla`` uses it: torch-xla needs its own torch release, so that environment
installs the project with ``--no-deps`` and then every other requirement listed here::

    python tools/requirements.py --extra test --without torch
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str], without: set[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return [r for r in reqs if re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() not in without]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extra", action="append", default=[], help="also list this optional extra (repeatable)")
    p.add_argument("--without", action="append", default=[], help="leave this distribution out (repeatable)")
    p.add_argument("--pyproject", type=Path, default=Path(__file__).resolve().parent.parent / "pyproject.toml")
    args = p.parse_args()
    print("\n".join(requirements(args.pyproject, args.extra, {w.lower() for w in args.without})))


if __name__ == "__main__":
    main()
