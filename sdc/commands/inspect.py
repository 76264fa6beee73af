"""``sdc inspect``: summarise a run: header, events by kind, steps, sites, clean or crashed."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sdc.commands import Command
from tracer.printable import printable

if TYPE_CHECKING:
    from tracer.summary import RankSummary


def add_parser(sub: argparse._SubParsersAction, command: Command) -> None:
    p = sub.add_parser(
        command.name,
        help=command.help,
        description="Read every record of a run (verifying every checksum) and summarise it.",
    )
    p.add_argument("run", type=Path, help="run directory, e.g. runs/golden")
    p.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="skip corrupt records instead of stopping at the first one, and count them",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracer.summary import summarize_run

    ranks = summarize_run(args.run, "skip" if args.skip_corrupt else "raise")
    if args.json:
        print(json.dumps([_as_dict(s) for s in ranks], indent=2, default=str))
    else:
        for s in ranks:
            print(_as_text(args.run, s))
    return 0


def _state(s: RankSummary) -> str:
    st = s.status
    damaged = bool(st.corruptions)
    if st.complete and st.end is not None:
        if st.end.status != "complete":
            state = f"closed after a failure ({st.end.detail})"
        else:
            state = "END record found, but the log is DAMAGED" if damaged else "clean close"
    elif s.out_of_space is not None:
        usable = [c for c in s.checkpoints if c <= s.out_of_space]
        then = f"resumable from checkpoint {max(usable)} (sdc record --resume)" if usable else "no checkpoint to resume"
        state = f"FAILED at step {s.out_of_space} for lack of space; {then}"
    else:
        state = "CRASHED: no end marker" + (" (torn final record)" if st.torn_tail else "")
    if st.lost:
        steps = st.lost_steps
        first = "?" if steps is None or steps[0] is None else steps[0]
        last = "end" if steps is None or steps[1] is None else steps[1]
        state += (
            f"; skipped corrupt data: lost: {st.lost_bytes} bytes, at least {st.lost_records} records, "
            f"steps {first}..{last} incomplete"
        )
    others = [c for c in st.corruptions if not any(r.file == c[0] and r.start == c[1] for r in st.lost)]
    if others:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        state += f"; corrupt: {others[0][0]} at byte {others[0][1]}: {others[0][2]}{more}"
    return state


def _as_dict(s: RankSummary) -> dict:
    h = s.header
    return {
        "rank": s.rank,
        "header": h.to_dict(),
        "state": _state(s),
        "complete": s.status.complete,
        "torn_tail": s.status.torn_tail,
        "corruptions": s.status.corruptions,
        "lost": [dataclasses.asdict(r) for r in s.status.lost],
        "segments": s.segments,
        "bytes": s.bytes,
        "records": s.records,
        "bytes_per_record": round(s.bytes_per_record, 1),
        "tensor_events": dict(s.tensors),
        "events": dict(s.events),
        "steps": [min(s.steps), max(s.steps)] if s.steps else [],
        "sites": s.sites,
        "parameters": s.parameters,
        "checkpoints": s.checkpoints,
    }


def _as_text(run: Path, s: RankSummary) -> str:
    h = s.header
    created = dt.datetime.fromtimestamp(h.created_unix, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    steps = f"{min(s.steps)}..{max(s.steps)} ({_plural(len(s.steps), 'step')})" if s.steps else "none"
    det = h.determinism
    lines = [
        f"run {run}  rank {s.rank} of {h.world_size}  node {h.node_label!r}  role {h.role}",
        f"  state        {_state(s)}",
        f"  run id       {h.run_id}  created {created}",
        f"  config       {h.config_fingerprint[:16]}  seed {h.seed}  data order {h.data_order_fingerprint[:16]}",
        f"  fingerprint  {h.fingerprint_algorithm}  device {h.device}  threads {det.get('intra_op_threads')}",
        "  software     " + "  ".join(f"{k} {v}" for k, v in h.versions.items()),
        f"  steps        {steps}",
        f"  sites        {len(s.sites)}: " + (", ".join(s.sites[:6]) + (" ..." if len(s.sites) > 6 else "")),
        f"  parameters   {s.parameters}",
        "  tensors      " + ", ".join(f"{k} {v}" for k, v in sorted(s.tensors.items())),
        "  events       " + ", ".join(f"{k} {v}" for k, v in sorted(s.events.items())),
        f"  checkpoints  {s.checkpoints or 'none'}",
        f"  log          {s.segments} segment(s), {s.bytes:,} bytes, {s.records:,} records, "
        f"{s.bytes_per_record:.1f} bytes/record",
    ]
    if h.extra:
        lines.append(f"  extra        {json.dumps(h.extra, default=str)}")
    return "\n".join(printable(line) for line in lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
