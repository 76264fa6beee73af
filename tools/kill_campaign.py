"""Kill `sdc record` at random moments, then read what it left; try bad command lines. Counts, not a test.

    .venv/bin/python tools/kill_campaign.py --kills 30 --seed 0

Each kill: a tiny `sdc record` in its own process, SIGKILLed at a random moment between creating its run
directory and its usual end; then `sdc inspect` and `sdc inspect --skip-corrupt` on what it left, and
`sdc record --overwrite` into the same folder (the writer lock of a dead process must not block it). Each bad command
line runs once.
Full disks: `sdc record` and `sdc study` under a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored, so writes fail
with EFBIG as on a full disk), and a killed recording resumed under the limit, then again without it: the
second resume must succeed ("data lost" counts those that do not). `sdc diff` under the same kind of limit, into a
new and into an existing database, and into databases sdctrace did not create ("data lost": a failed diff that left
a database behind or changed one). Every outcome is one of: ok, clean (a
one-line `sdc: error`), traceback, hang. Prints one line per case and the totals.
"""

from __future__ import annotations

import argparse
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

SDC = [sys.executable, "-m", "sdc.cli"]
TINY = ["--steps", "20", "--set", "model.n_layers=1", "--set", "run.checkpoint_every=2", "--quiet"]
TIMEOUT_S = 120


def outcome(args: list[str], fsize: int | None = None) -> tuple[str, str]:
    """What `sdc args` ends in; with ``fsize``, under that file-size limit (a full disk)."""
    try:
        done = subprocess.run(
            [*SDC, *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            preexec_fn=None if fsize is None else lambda: _disk_of(fsize),
        )
    except subprocess.TimeoutExpired:
        return "hang", ""
    if "Traceback" in done.stderr:
        return "traceback", done.stderr.strip().splitlines()[-1]
    if done.returncode == 0:
        return "ok", done.stdout.strip().splitlines()[1] if done.stdout.count("\n") > 1 else done.stdout.strip()
    lines = done.stderr.strip().splitlines()
    return ("clean" if len(lines) == 1 and lines[0].startswith("sdc: error") else "traceback"), lines[-1]


def _disk_of(fsize: int) -> None:
    """In the child: files stop growing at ``fsize`` bytes, and writes past it fail with EFBIG (no SIGXFSZ)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))


def _started(out: Path, proc: subprocess.Popen[bytes]) -> float:
    """Wait until the recording has created its run directory (imports take most of a process's life)."""
    while not out.exists() and proc.poll() is None:
        time.sleep(0.005)
    return time.perf_counter()


def kills(n: int, seed: int, root: Path, totals: Counter[str]) -> None:
    rng = random.Random(seed)
    timing = root / "timing"
    proc = subprocess.Popen([*SDC, "record", "--out", str(timing), "--node-label", "t", *TINY])
    began = _started(timing, proc)
    proc.wait()
    window = time.perf_counter() - began  # from the run directory's creation to the process's end
    for i in range(n):
        out = root / f"killed-{i}"
        proc = subprocess.Popen(
            [*SDC, "record", "--out", str(out), "--node-label", "k", *TINY],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _started(out, proc)
        delay = rng.uniform(0.0, window)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        for name, args in (
            ("inspect", ["inspect", str(out)]),
            ("inspect --skip-corrupt", ["inspect", "--skip-corrupt", str(out)]),
            ("record --overwrite", ["record", "--out", str(out), "--node-label", "k", "--overwrite", *TINY]),
        ):
            kind, line = outcome(args)
            totals[f"kill/{name}/{kind}"] += 1
            print(f"kill {i:>3} at {delay:5.2f} s  {name:<24} {kind:<9} {line[:110]}")


def bad_command_lines(root: Path, totals: Counter[str]) -> None:
    run = root / "timing"
    (root / "file.txt").write_text("not a run")
    cases = [
        ["record", "--out", str(root / "file.txt" / "run")],
        ["record", "--out", str(root / "r1"), "--steps", "0"],
        ["record", "--out", str(root / "r1"), "--steps", str(10**23)],
        ["record", "--out", str(root / "r1"), "--set", "model.dimm=3"],
        ["record", "--out", str(root / "r1"), "--set", "model.dim=1048576"],
        ["record", "--out", str(root / "r1"), "--config", str(root / "missing.toml")],
        ["record", "--out", str(root / "r1"), "--fault-profile", "no-such-profile"],
        ["record", "--out", str(root / "r1"), "--workload", "no.such:thing"],
        ["record", "--out", str(root / "r1"), "--sites", "("],
        ["record", "--out", str(root / "r1"), "--capture-steps", "a,b"],
        ["record", "--out", str(run), "--node-label", "x"],
        ["inspect", str(root / "nothing")],
        ["inspect", str(root / "file.txt")],
        [
            "replay",
            "--golden",
            str(run),
            "--fault-profile",
            "healthy-node",
            "--steps",
            "5:2",
            "--out",
            str(root / "r2"),
        ],
        [
            "replay",
            "--golden",
            str(run),
            "--fault-profile",
            "healthy-node",
            "--steps",
            "1:99",
            "--out",
            str(root / "r2"),
        ],
        [
            "replay",
            "--golden",
            str(run),
            "--fault-profile",
            "healthy-node",
            "--steps",
            "1",
            "--out",
            str(run),
            "--overwrite",
        ],
        [
            "replay",
            "--golden",
            str(root / "nothing"),
            "--fault-profile",
            "healthy-node",
            "--steps",
            "1",
            "--out",
            str(root / "r2"),
        ],
        ["diff", "--golden", str(run), "--suspect", str(root / "nothing"), "--db", str(root / "d.duckdb")],
        ["diff", "--golden", str(run), "--suspect", str(run), "--db", str(root)],
        ["diff", "--golden", str(run), "--suspect", str(run), "--db", str(root / "file.txt")],
        [
            "diff",
            "--golden",
            str(run),
            "--suspect",
            str(run),
            "--db",
            str(root / "d.duckdb"),
            "--",
            "--runner",
            "NoSuchRunner",
        ],
        ["query", "summary", "--db", str(root / "missing.duckdb")],
        ["query", "--sql", "DROP TABLE runs", "--db", str(root / "d.duckdb")],
        ["query", "no_such_query", "--db", str(root / "d.duckdb")],
        ["report", "--db", str(root / "file.txt"), "--out", str(root / "rep")],
        ["faults", "show", "no-such-profile"],
        ["finetune", "--from", str(root / "nothing"), "--out", str(root / "ft")],
        ["finetune", "--from", str(run), "--out", str(run), "--overwrite"],
        ["study", "no-such-study", "--out", str(root / "s")],
        ["verify-determinism", "--steps", "-1"],
    ]
    for args in cases:
        kind, line = outcome(args)
        totals[f"bad command line/{kind}"] += 1
        print(f"bad  {' '.join(args[:2]):<28} {kind:<9} {line[:110]}")


FSIZES = (2_000, 20_000, 200_000)  # bytes a file may grow to: a header, a segment's first blocks, a checkpoint


def full_disks(root: Path, totals: Counter[str], seed: int) -> None:
    """Record and study on a full disk; a killed recording resumed on a full disk, then with room."""
    rng = random.Random(seed)
    for fsize in FSIZES:
        cases = [
            ("record", ["record", "--out", str(root / f"full-{fsize}"), "--node-label", "f", *TINY]),
            ("study", ["study", "demo", "--out", str(root / f"study-{fsize}"), "--set", "model.n_layers=1", "--quiet"]),
        ]
        for name, args in cases:
            kind, line = outcome(args, fsize)
            totals[f"full disk/{name}/{kind}"] += 1
            print(f"full {fsize:>7} B  {name:<24} {kind:<9} {line[:110]}")
        out = root / f"resume-{fsize}"
        proc = subprocess.Popen(
            [*SDC, "record", "--out", str(out), "--node-label", "r", *TINY],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not (out / "checkpoints" / "step-000004").exists() and proc.poll() is None:  # two checkpoints
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.5))
        proc.kill()
        proc.wait()
        resume = ["record", "--out", str(out), "--node-label", "r", "--resume", *TINY]
        for name, limit in (("resume on a full disk", fsize), ("resume with room", None)):
            kind, line = outcome(resume, limit)
            totals[f"full disk/{name}/{kind}"] += 1
            print(f"full {fsize:>7} B  {name:<24} {kind:<9} {line[:110]}")
        if kind != "ok" and "nothing to resume" not in line and "no checkpoint" not in line:
            totals["data lost"] += 1  # the killed run could be resumed before the failed attempt, and not after


def diff_full_disks_and_foreign_dbs(root: Path, totals: Counter[str]) -> None:
    """`sdc diff` of the timing run with itself under a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored: a write past
    it fails with EFBIG, as on a full disk), into a new --db and into a copy of one that holds the pair; then into
    databases sdctrace did not create. Counts each outcome, and as "data lost" a failed diff that left a new
    database (or a scratch folder) behind, or changed an existing or foreign one."""
    import hashlib
    import resource
    import shutil
    import signal

    import duckdb

    run, work = root / "timing", root / "full-disk"
    if not run.exists():  # --only-full-disks: no kills ran
        subprocess.run(
            [*SDC, "record", "--out", str(run), "--node-label", "t", *TINY],
            capture_output=True,
            timeout=TIMEOUT_S,
            check=True,
        )
    work.mkdir()
    base = work / "base.duckdb"
    subprocess.run(
        [*SDC, "diff", "--golden", str(run), "--suspect", str(run), "--db", str(base)],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=True,
    )

    def digest(path: Path) -> str | None:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None

    def diff(db: Path, limit: int | None) -> tuple[str, str]:
        def limit_writes() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        try:
            done = subprocess.run(
                [*SDC, "diff", "--golden", str(run), "--suspect", str(run), "--db", str(db)],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                preexec_fn=limit_writes if limit else None,
            )
        except subprocess.TimeoutExpired:
            return "hang", ""
        lines = done.stderr.strip().splitlines()
        if done.returncode == 0:
            return "ok", "loaded"
        if "Traceback" in done.stderr or len(lines) != 1 or not lines[0].startswith("sdc: error"):
            return "traceback", lines[-1] if lines else ""
        return "clean", lines[0]

    foreign = {"foreign duckdb": "CREATE TABLE runs (x INTEGER)", "text file": None}
    cases = [
        (f"{kind} db, limit {limit}", kind, limit)
        for kind in ("new", "existing")
        for limit in (1_000, 4_000, 16_000, 64_000, 256_000, 1 << 20)
    ]
    cases += [(name, name, None) for name in foreign]
    for i, (name, kind, limit) in enumerate(cases):
        folder = work / f"case-{i}"
        folder.mkdir()
        db = folder / "study.duckdb"
        if kind == "existing":
            shutil.copy(base, db)
        elif kind == "text file":
            db.write_text("my notes\n")
        elif kind in foreign:
            with duckdb.connect(str(db)) as con:
                con.execute(foreign[kind])
        before = digest(db)
        result, line = diff(db, limit)
        left = sorted(p.name for p in folder.iterdir() if p.name != db.name)
        lost = result != "ok" and (digest(db) != before or bool(left))
        totals[f"diff full disk/{result}"] += 1
        totals["diff full disk/data lost"] += lost
        print(f"disk {name:<28} {result:<9} {'DATA LOST ' if lost else ''}{line[:110]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=30, help="recordings to kill (default 30)")
    p.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    p.add_argument("--only-full-disks", action="store_true", help="run the full-disk and resume cases only")
    args = p.parse_args(argv)
    totals: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="sdc-campaign-") as tmp:
        if not args.only_full_disks:
            kills(args.kills, args.seed, Path(tmp), totals)
            bad_command_lines(Path(tmp), totals)
        full_disks(Path(tmp), totals, args.seed)
        diff_full_disks_and_foreign_dbs(Path(tmp), totals)
    print("\ntotals:")
    for key, count in sorted(totals.items()):
        print(f"  {key:<48} {count}")
    return 0 if not any(k.endswith(("/traceback", "/hang")) or k == "data lost" for k in totals) else 1


if __name__ == "__main__":
    sys.exit(main())
