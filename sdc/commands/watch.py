"""``sdc watch``: compare two runs while they are recorded; report their first divergence once it is on disk.

    sdc watch --golden runs/trusted --suspect runs/new-node [--keep-going] [--idle-timeout 600]

Its stages, as the diff's: follow → match → compare → render.

- follow: a `LogFollower` per rank of each run (`tracer.log.follow`), polled in turn. A
  run more than `AHEAD` steps ahead of the other is not read until the other catches
  up: its records wait on disk, not in memory.
- match (`Matcher`): a tensor record waits under (rank, step, microbatch, name, phase,
  occurrence) until the other run's record of that key comes; only those are held,
  at most ``--max-pending`` of them.
- compare: fingerprints, bit for bit. At the end of a step in both runs (its ``step``
  event), a record that only one run holds is a divergence too.
- render: progress, the first divergence (both fingerprints and stats), a writer that
  crashed, resumed (records of the steps it writes again are compared again), finished.

Exit status: 0 both runs finished, identical; 3 they diverged; 4 incomplete: a run
crashed or never started, and nothing came and no writer ran for ``--idle-timeout``
seconds (identical as far as compared); 1 an error (the runs do not pair,
``--max-pending`` exceeded); 2 bad usage. Documented in docs/watch.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from sdc.commands import Command
from tracer.compare import Divergence
from tracer.errors import UsageError
from tracer.log import Entry, EventRecord, LostRange, TensorRecord, rank_dir
from tracer.log.follow import POLL_S, LogFollower, Resumed
from tracer.log.records import describe_microbatch
from tracer.printable import printable

EXIT_IDENTICAL, EXIT_DIVERGED, EXIT_INCOMPLETE = 0, 3, 4
SIDES = ("golden", "suspect")
AHEAD = 1  # steps one run may be read ahead of the other
MAX_PENDING = 1_000_000  # records held for the other run at most (about 200 bytes each)

Key = tuple[int, int, int, str, int, int]  # rank, step, microbatch, name, phase, occurrence


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=(
            "Follow a golden and a suspect run while they are being recorded (two nodes training the same "
            "config on the same data) and compare every fingerprint as soon as both runs have it on disk. Prints "
            "progress and the first divergence: step, rank, microbatch, tensor, phase, both fingerprints and the "
            "stats both logs hold. A writer that crashes is waited for (up to --idle-timeout) until `sdc record "
            "--resume` continues it. Exit status: 0 both runs finished identical; 3 they diverged; 4 a run "
            "crashed or never started and nothing came for --idle-timeout seconds; 1 an error (the runs do not pair)."
        ),
        epilog="Start it before, while or after the two recordings run; docs/watch.md has the details.",
    )
    p.add_argument("--golden", required=True, type=Path, metavar="RUN", help="the trusted run's directory")
    p.add_argument("--suspect", required=True, type=Path, metavar="RUN", help="the run under test's directory")
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="after a divergence, keep following and report each further diverging step once "
        "(exit status 3 at the end)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="give up when nothing new came and no writer ran for S seconds (default 600): a run "
        "that does not start, or crashed and is not resumed",
    )
    p.add_argument(
        "--max-pending",
        type=int,
        default=MAX_PENDING,
        metavar="N",
        help=f"records held for the other run at most (default {MAX_PENDING:,}); more is an error",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between progress lines (default 10; 0: every compared step)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.idle_timeout <= 0 or args.max_pending <= 0 or args.progress_every < 0:
        raise UsageError("--idle-timeout and --max-pending must be > 0, --progress-every >= 0")
    options = WatchOptions(args.keep_going, args.idle_timeout, args.max_pending, args.progress_every)
    return Watch(args.golden, args.suspect, options).run()


@dataclass(frozen=True)
class WatchOptions:
    keep_going: bool = False
    idle_timeout_s: float = 600.0
    max_pending: int = MAX_PENDING
    progress_every_s: float = 10.0
    poll_s: float = POLL_S


def _render(d: Divergence) -> list[str]:
    """What watch prints of a divergence, line by line: where, then each run's record with its stats."""
    head = (
        f"DIVERGENCE at step {d.step}, rank {d.rank}, {describe_microbatch(d.microbatch)}: {d.name} "
        f"{d.phase.name.lower()}"
    )
    sides = zip(SIDES, (d.golden, d.suspect))
    return [head, *(f"  {side:<8}{_stats(rec)}" for side, rec in sides)]


def _stats(rec: TensorRecord | None) -> str:
    if rec is None:
        return "(no such record: only the other run holds it)"
    return (
        f"fingerprint {rec.fingerprint:016x}  l2 {rec.l2:.9g}  absmax {rec.absmax:.9g}  nan {rec.nan}  "
        f"inf {rec.inf}  {rec.meta}"
    )


class Matcher:
    """Pairs the two runs' tensor records by key and compares them; holds only records not yet paired."""

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.pending: tuple[dict[Key, TensorRecord], dict[Key, TensorRecord]] = ({}, {})
        self._occurrences: tuple[dict[tuple[int, int], Counter], dict[tuple[int, int], Counter]] = ({}, {})
        self._ended: tuple[dict[int, int], dict[int, int]] = ({}, {})  # rank -> last step with a `step` event
        self._lost: tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]] = ([], [])  # (rank, first, last)
        self.compared = 0  # records compared
        self.through: dict[int, int] = {}  # rank -> last step compared in both runs
        self.uncompared = 0  # records only one run holds, in steps corruption hid in the other

    def add(self, side: int, rank: int, rec: TensorRecord) -> Divergence | None:
        where = (rec.microbatch, rec.name, int(rec.phase))
        counts = self._occurrences[side].setdefault((rank, rec.step), Counter())
        key = (rank, rec.step, *where, counts[where])
        counts[where] += 1
        other = self.pending[1 - side].pop(key, None)
        if other is None:
            self.pending[side][key] = rec
            if len(self.pending[side]) > self.max_pending:
                raise UsageError(
                    f"the {SIDES[side]} run is more than {self.max_pending:,} records ahead of the other within a "
                    f"step (--max-pending): give a larger --max-pending"
                )
            return None
        self.compared += 1
        if other.fingerprint == rec.fingerprint:
            return None
        golden, suspect = (rec, other) if side == 0 else (other, rec)
        return Divergence(rank, rec.step, rec.microbatch, rec.name, rec.phase, golden, suspect)

    def end_step(self, side: int, rank: int, step: int) -> list[Divergence]:
        """`step` ended in one run; once it ended in both, records only one of them holds are divergences."""
        self._ended[side][rank] = max(step, self._ended[side].get(rank, -1))
        done = min(self._ended[0].get(rank, -1), self._ended[1].get(rank, -1))
        before = self.through.get(rank, -1)
        if done <= before:
            return []
        self.through[rank] = done
        return self._leftovers(rank, before, done)

    def _leftovers(self, rank: int, after: int, through: int) -> list[Divergence]:
        """Records still waiting for the other run in steps `after` < step <= `through`, which ended in both."""
        out = []
        for side, pending in enumerate(self.pending):
            for key in sorted(k for k in pending if k[0] == rank and after < k[1] <= through):
                rec = pending.pop(key)
                if any(r == rank and first <= rec.step <= last for lost in self._lost for r, first, last in lost):
                    self.uncompared += 1
                else:
                    pair = (rec, None) if side == 0 else (None, rec)
                    out.append(Divergence(rank, rec.step, rec.microbatch, rec.name, rec.phase, *pair))
        for occurrences in self._occurrences:
            for key in [k for k in occurrences if k[0] == rank and after < k[1] <= through]:
                del occurrences[key]
        return sorted(out, key=lambda d: d.step)

    def lost(self, side: int, rank: int, lost: LostRange) -> None:
        """Corruption hid records of these steps in one run: the other's records there are not divergences."""
        self._lost[side].append((rank, lost.first_step or 0, lost.last_step if lost.last_step is not None else 1 << 62))

    def forget(self, side: int, rank: int, from_step: int) -> None:
        """One run's records of `rank` from `from_step` on are superseded (a resumption): they come again."""
        pending = self.pending[side]
        for key in [k for k in pending if k[0] == rank and k[1] >= from_step]:
            del pending[key]
        occurrences = self._occurrences[side]
        for key in [k for k in occurrences if k[0] == rank and k[1] >= from_step]:
            del occurrences[key]
        if self._ended[side].get(rank, -1) >= from_step:
            self._ended[side][rank] = from_step - 1
        if self.through.get(rank, -1) >= from_step:
            self.through[rank] = from_step - 1


class _Follow:
    """One rank of one run: its follower, how far it has been read, what was last said about its writer."""

    def __init__(self, run: Path, rank: int, from_step: int = 0) -> None:
        self.follower = LogFollower(rank_dir(run, rank), on_corruption="skip", from_step=from_step)
        self.step = from_step - 1  # highest step read
        self.said = "waiting"
        self.backlog: list[Entry | LostRange | Resumed] = []  # read with the header, before the runs were paired


class Watch:
    """Follow the golden and suspect runs to their ends, comparing as records arrive; `run` returns the exit status."""

    def __init__(
        self,
        golden: Path,
        suspect: Path,
        options: WatchOptions = WatchOptions(),
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runs = (Path(golden), Path(suspect))
        self.options = options
        self.out = out or sys.stdout
        self.clock = clock
        self.matcher = Matcher(options.max_pending)
        self.follows: tuple[dict[int, _Follow], dict[int, _Follow]] = (
            {0: _Follow(self.runs[0], 0)},
            {0: _Follow(self.runs[1], 0)},
        )
        self.paired = False
        self._said_waiting = False
        self.divergences = 0
        self._reported: set[tuple[int, int]] = set()  # (rank, step) with a divergence reported
        self._said_through = -1
        self._last_progress = clock()

    def run(self) -> int:
        self._say(f"watching golden {self.runs[0]} and suspect {self.runs[1]}")
        idle_since = self.clock()
        while True:
            got = self._pair()
            for side in (0, 1):
                for rank, f in list(self.follows[side].items()):
                    if not self.paired or self._ahead(side, rank):
                        continue
                    items, f.backlog = f.backlog + f.follower.poll(), []
                    got = got or bool(items)
                    for item in items:
                        if self._take(side, rank, item) and not self.options.keep_going:
                            self._say(
                                f"sdc watch: the runs diverged at step {self._first_step()}; exit status "
                                f"{EXIT_DIVERGED}"
                            )
                            return EXIT_DIVERGED
            self._writers()
            self._progress()
            if self._finished():
                return self._end()
            now = self.clock()
            if got or self._writing():
                idle_since = now
            elif now - idle_since >= self.options.idle_timeout_s:
                return self._give_up()
            if not got:
                time.sleep(self.options.poll_s)

    # -- follow ------------------------------------------------------------------------
    def _writing(self) -> bool:
        """A writer holds its run's lock: a slow step is no reason to give up."""
        return any(f.follower.writer_alive() for side in self.follows for f in side.values())

    def _ahead(self, side: int, rank: int) -> bool:
        other = self.follows[1 - side].get(rank)
        if other is None or other.follower.state == "finished":
            return False
        return self.follows[side][rank].step > other.step + AHEAD

    def _take(self, side: int, rank: int, item: Entry | LostRange | Resumed) -> bool:
        """Handle one item; True if it showed a new divergence."""
        f = self.follows[side][rank]
        if isinstance(item, Resumed):
            self._resumed(side, rank, item)
            return False
        if isinstance(item, LostRange):
            self.matcher.lost(side, rank, item)
            self._say(
                f"{SIDES[side]} rank {rank}: {item.records} record(s) lost to corruption in {item.file} at byte "
                f"{item.start} (steps {item.first_step}..{item.last_step}); not compared"
            )
            return False
        rec = item.record
        f.step = max(f.step, rec.step)
        if isinstance(rec, TensorRecord):
            found = [d] if (d := self.matcher.add(side, rank, rec)) is not None else []
        elif isinstance(rec, EventRecord) and rec.kind == "step":
            found = self.matcher.end_step(side, rank, rec.step)
        else:
            return False
        return any([self._report(d) for d in found])

    def _resumed(self, side: int, rank: int, r: Resumed) -> None:
        """A writer restarted from a checkpoint: its records from there on come again, and are compared again
        with the other run's, which are read again from that step."""
        crashed = f" (it had completed step {r.last_step})" if r.last_step is not None else ""
        if self.follows[side][rank].said != "crashed":  # it crashed and came back between two looks: say so still
            after = f"after step {r.last_step}" if r.last_step is not None else "before completing a step"
            self._say(f"{SIDES[side]} rank {rank}: the writer stopped without finishing (crashed) {after}")
        self._say(
            f"{SIDES[side]} rank {rank}: resumed from the checkpoint of step {r.step}{crashed}; steps from "
            f"{r.step} on are compared again"
        )
        self.matcher.forget(side, rank, r.step)
        self.follows[side][rank].step = r.step - 1
        other = self.follows[1 - side].get(rank)
        if other is not None and other.step >= r.step:
            self.matcher.forget(1 - side, rank, r.step)
            other.follower.close()
            fresh = _Follow(self.runs[1 - side], rank, from_step=r.step)
            fresh.said = other.said
            self.follows[1 - side][rank] = fresh

    def _pair(self) -> bool:
        """Until both runs' headers are read, read them (what comes with them waits); then check that the runs
        pair and follow every rank. True: something was read."""
        if self.paired:
            return False
        got = False
        for side in (0, 1):
            f = self.follows[side][0]
            if f.follower.header is None:
                f.backlog += f.follower.poll()
                got = got or bool(f.backlog)
        golden, suspect = (self.follows[side][0].follower.header for side in (0, 1))
        if golden is None or suspect is None:
            if (golden, suspect) != (None, None) and not self._said_waiting:
                self._said_waiting = True
                side = 1 if suspect is None else 0
                self._say(
                    f"the {SIDES[1 - side]} run is being recorded; waiting for the {SIDES[side]} run's log in "
                    f"{self.runs[side]} (up to {self.options.idle_timeout_s:g} s)"
                )
            return got
        from tracer.pairing import check_pair  # imports torch (tracer.sharding): not for `sdc watch --help`

        check_pair(golden, suspect, str(self.runs[0]), str(self.runs[1]))
        self.paired = True
        for side in (0, 1):
            for rank in range(1, golden.world_size):
                self.follows[side][rank] = _Follow(self.runs[side], rank)
        self._say(
            f"the runs pair: {golden.world_size} rank(s), golden node {golden.node_label!r}, suspect node "
            f"{suspect.node_label!r}"
        )
        return got

    def _writers(self) -> None:
        """Say when a writer crashes, comes back or finishes."""
        for side in (0, 1):
            for rank, f in self.follows[side].items():
                state = f.follower.state
                said = f.said
                if state == said or state == "waiting":
                    continue
                f.said = state
                who = f"{SIDES[side]} rank {rank}"
                if state == "crashed":
                    self._say(
                        f"{who}: the writer stopped without finishing (crashed) after step {f.step}; waiting up "
                        f"to {self.options.idle_timeout_s:g} s for it to resume (sdc record --resume)"
                    )
                elif state == "finished":
                    end = f.follower.status.end
                    how = "" if end is None or end.status == "complete" else f" ({end.status}: {end.detail})"
                    self._say(f"{who}: finished{how}")
                elif state == "writing" and said == "crashed":
                    self._say(f"{who}: the writer is back")

    # -- render ------------------------------------------------------------------------
    def _report(self, d: Divergence) -> bool:
        if (d.rank, d.step) in self._reported:
            return False
        self._reported.add((d.rank, d.step))
        self.divergences += 1
        for line in _render(d):  # a line each: printable escapes a line break inside one
            self._say(line)
        return True

    def _first_step(self) -> int:
        return min(step for _, step in self._reported)

    def _progress(self) -> None:
        through = min(self.matcher.through.values()) if self.matcher.through else -1
        if through <= self._said_through:
            return
        now = self.clock()
        if now - self._last_progress < self.options.progress_every_s and not self._finished():
            return
        self._said_through, self._last_progress = through, now
        state = "identical" if not self.divergences else f"{self.divergences} diverging step(s)"
        self._say(f"compared through step {through}: {state} ({self.matcher.compared:,} records)")

    def _finished(self) -> bool:
        return self.paired and all(f.follower.state == "finished" for side in self.follows for f in side.values())

    def _end(self) -> int:
        for rank in self.follows[0]:
            for d in self.matcher.end_step(0, rank, 1 << 40) + self.matcher.end_step(1, rank, 1 << 40):
                self._report(d)
        if self.divergences:
            self._say(
                f"sdc watch: both runs finished; they diverged at step {self._first_step()} "
                f"({self.divergences} diverging step(s)); exit status {EXIT_DIVERGED}"
            )
            return EXIT_DIVERGED
        self._say(
            f"sdc watch: both runs finished, identical ({self.matcher.compared:,} records compared"
            + (f", {self.matcher.uncompared:,} not: lost to corruption" if self.matcher.uncompared else "")
            + ")"
        )
        return EXIT_IDENTICAL

    def _give_up(self) -> int:
        states = [
            f"{SIDES[side]} rank {rank} " + ("read ahead, not further" if self._ahead(side, rank) else f.follower.state)
            for side in (0, 1)
            for rank, f in self.follows[side].items()
            if f.follower.state != "finished"
        ]
        why = (
            f"sdc watch: nothing new and no writer running for {self.options.idle_timeout_s:g} s ({', '.join(states)})"
        )
        if self.divergences:
            self._say(f"{why}; the runs diverged at step {self._first_step()}; exit status {EXIT_DIVERGED}")
            return EXIT_DIVERGED
        self._say(
            f"{why}; identical as far as compared ({self.matcher.compared:,} records); exit status {EXIT_INCOMPLETE}"
        )
        return EXIT_INCOMPLETE

    def _say(self, line: str) -> None:
        print(printable(line), file=self.out, flush=True)
