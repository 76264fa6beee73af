"""`sdc` starts fast: the parser, `sdc --help`, the help of the commands that run neither torch nor Beam, and
`sdc query` on a real study database import neither torch nor Beam, each checked in a fresh process; the parser
`main` builds (the command being run whole, the others by name and one-line help) prints the same help as the
whole parser."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.load import load_parquet
from sdc.cli import build_parser, command_named
from sdc.commands import COMMANDS
from tests.analysis.test_load import stage

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "apache_beam", "transformers", "lightning", "numpy", "pyarrow")
# `sdc --help` and `sdc query --help` import none of HEAVY; the help of these commands none but numpy (`sdc watch`
# reads logs with it). The other commands list what they run in their help (shipped fault profiles, configs and
# studies, whose modules import torch).
LIGHT_HELP = ("inspect", "diff", "watch", "report", "demo")


def fresh_python(code: str, env: dict[str, str] | None = None) -> dict:
    """Run `code` in a fresh interpreter (with ``env`` added to the environment); it prints one JSON object as its
    last line."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


HEAVY_LOADED = f"sorted(m for m in {HEAVY!r} if m in sys.modules)"


def test_the_parser_and_help_import_neither_torch_nor_beam() -> None:
    loaded = fresh_python(f"""
import contextlib, io, json, sys
steps = {{}}
import sdc.cli
steps["import sdc.cli"] = {HEAVY_LOADED}
sdc.cli.build_parser(sdc.cli.command_named(["--help"]))
steps["build the parser"] = {HEAVY_LOADED}
for argv in [["--help"], ["query", "--help"], *[[c, "--help"] for c in {LIGHT_HELP!r}]]:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        sdc.cli.main(argv)
    assert out.getvalue().startswith("usage: sdc"), out.getvalue()
    steps["sdc " + " ".join(argv)] = {HEAVY_LOADED}
print(json.dumps(steps))
""")
    strict = {step: [] for step in ("import sdc.cli", "build the parser", "sdc --help", "sdc query --help")}
    assert loaded == {**strict, **{f"sdc {c} --help": loaded[f"sdc {c} --help"] for c in LIGHT_HELP}}
    assert all(set(loaded[f"sdc {c} --help"]) <= {"numpy"} for c in LIGHT_HELP), loaded


def test_sdc_query_on_a_study_database_imports_neither_torch_nor_beam(tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    load_parquet(db, stage(tmp_path / "staging", [3.0, 2.0, 1.5]), "pair-a")
    result = fresh_python(f"""
import contextlib, io, json, sys
from sdc.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["query", "--sql", "SELECT count(*) AS n, min(golden_loss) AS low FROM loss", "--db", {str(db)!r},
                 "--format", "json"])
print(json.dumps({{"code": code, "out": json.loads(out.getvalue()), "heavy": {HEAVY_LOADED}}}))
""")
    assert result == {"code": 0, "out": [{"n": 3, "low": 1.5}], "heavy": []}


def test_main_names_the_command_being_run() -> None:
    assert command_named(["query", "--db", "x"]) == ("query",)
    assert command_named(["--help"]) == () and command_named([]) == ()
    assert command_named(["-h", "faults", "list"]) == ("faults",)


def test_the_top_level_help_is_the_same_with_every_command_built_or_none() -> None:
    whole, stubs = build_parser(), build_parser(whole=())
    assert stubs.format_help() == whole.format_help()
    assert [c.name for c in COMMANDS] == list(subcommands(whole)) == list(subcommands(stubs))


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def help_of(parser: argparse.ArgumentParser, path: list[str]) -> str:
    for name in path:
        parser = subcommands(parser)[name]
    return parser.format_help()


HELP_PATHS = [[c.name] for c in COMMANDS] + [["faults", a] for a in ("list", "show", "fleet")]


@pytest.fixture(scope="module")
def printed_help() -> dict[str, str]:
    """`sdc CMD --help` of every command, each through `main` (the parser it builds for that command), in one fresh
    process: a process per command cost 2.5 s of start-up each."""
    return fresh_python(
        f"""
import contextlib, io, json
import sdc.cli
printed = {{}}
for path in {HELP_PATHS!r}:
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        sdc.cli.main([*path, "--help"])
    printed[" ".join(path)] = out.getvalue()
print(json.dumps(printed))
""",
        env={"COLUMNS": "100"},
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", HELP_PATHS, ids=" ".join)
def test_each_command_prints_the_help_of_the_whole_parser(
    path: list[str], printed_help: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sdc CMD --help` (the parser `main` builds) against the whole parser's help."""
    monkeypatch.setenv("COLUMNS", "100")
    assert printed_help[" ".join(path)] == help_of(build_parser(), path)
