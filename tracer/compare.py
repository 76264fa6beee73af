"""Walk two runs side by side and find the first event whose bits differ.

This is the quick, single-process check behind ``sdc verify-determinism``; the
Beam pipelines do the full diff. Runs of different length compare over the
shorter one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracer.errors import ValidationError
from tracer.log import list_ranks, rank_dir
from tracer.log.reader import LogReader
from tracer.log.records import NO_MICROBATCH, EventRecord, Phase, TensorRecord, describe_microbatch
from tracer.printable import printable


@dataclass(frozen=True)
class Divergence:
    """Where two runs stop agreeing: the site, and each run's record there (None: only the other run holds one).

    `compare_runs` and ``sdc watch`` (which follows two runs as they are written) both report them.
    """

    rank: int
    step: int
    microbatch: int
    name: str
    phase: Phase
    golden: TensorRecord | None
    suspect: TensorRecord | None

    def describe(self) -> str:
        """One line: where, and how the two records differ."""
        mb = describe_microbatch(self.microbatch)
        where = f"rank {self.rank}, step {self.step}, {mb}, {self.phase.name.lower()} {printable(self.name)}"
        a, b = self.golden, self.suspect
        if a is None or b is None:
            return f"{where}: the runs recorded different events here (one has no matching event)"
        if (a.name, a.phase) != (b.name, b.phase):
            return f"{where}: event order differs ({printable(a.name)} vs {printable(b.name)})"
        return f"{where}: fingerprint {a.fingerprint:016x} vs {b.fingerprint:016x} (L2 {a.l2:.6g} vs {b.l2:.6g})"


@dataclass(frozen=True)
class Comparison:
    events: int  # tensor events compared
    steps: int  # steps compared
    first: Divergence | None


def compare_runs(golden: str | Path, suspect: str | Path) -> Comparison:
    """Compare every tensor event of every rank, in recording order (for ``sdc verify-determinism`` the first
    run plays golden).

    The first difference reported is the earliest over all ranks: lowest step, then
    lowest position within that step's records (ranks of one layout record the same
    sequence), so a fault on one rank is reported on that rank, not on a rank it
    reached through a collective. The stages of a pipeline record different sequences: there the order is the
    diff's (`pipeline_order`).
    """
    from tracer.parallel import pipeline_of  # imports torch: not at module level, which `sdc watch --help` loads

    ranks_a, ranks_b = list_ranks(Path(golden)), list_ranks(Path(suspect))
    if ranks_a != ranks_b:
        raise ValidationError(
            f"{golden} has ranks {ranks_a} but {suspect} has ranks {ranks_b}; they cannot be compared"
        )
    events = 0
    steps: set[int] = set()
    pipeline = pipeline_of(LogReader(rank_dir(Path(golden), ranks_a[0])).header.extra) is not None if ranks_a else False
    firsts: list[tuple[tuple[int, ...], Divergence]] = []
    for rank in ranks_a:
        ra = (r for r in LogReader(rank_dir(Path(golden), rank)).records() if isinstance(r, TensorRecord))
        rb = (r for r in LogReader(rank_dir(Path(suspect), rank)).records() if isinstance(r, TensorRecord))
        position, current = 0, None
        for a in ra:
            b = next(rb, None)
            if b is None:
                break
            position = position + 1 if a.step == current else 0
            current = a.step
            if (a.step, a.microbatch, a.name, a.phase) != (b.step, b.microbatch, b.name, b.phase):
                first = a if (a.step, a.microbatch) <= (b.step, b.microbatch) else b
                diff = Divergence(rank, first.step, first.microbatch, first.name, first.phase, a, b)
            elif a.fingerprint != b.fingerprint:
                diff = Divergence(rank, a.step, a.microbatch, a.name, a.phase, a, b)
            else:
                events += 1
                steps.add(a.step)
                continue
            where = (*pipeline_order(diff), position) if pipeline else (position,)
            firsts.append(((diff.step, *where, rank), diff))
            break
    return Comparison(events, len(steps), min(firsts, key=lambda f: f[0])[1] if firsts else None)


PHASE_ORDER = {Phase.INPUT: 0, Phase.FORWARD: 1, Phase.BACKWARD: 2, Phase.GRAD: 3, Phase.PARAM: 4}
RECEIVED = re.compile(r"pipeline\.\d+-(\d+)\.recv\.out")  # what stage D received (tracer.pipeline)


def pipeline_order(d: Divergence) -> tuple[int, int, int, int]:
    """Where a pipeline stage's first divergence falls within its step, as the diff orders them
    (analysis/schema.sql, ``first_divergence_ranked``): microbatch (step-level records last), phase, then a
    stage's own records before what it received, receivers in the pipeline's order (forward: up the stages;
    backward: down)."""
    phase = PHASE_ORDER[d.phase]
    microbatch = NO_MICROBATCH if d.phase in (Phase.GRAD, Phase.PARAM) else d.microbatch
    hop = RECEIVED.fullmatch(d.name)
    if hop is None:
        return microbatch, phase, 0, 0
    return microbatch, phase, 1, int(hop.group(1)) * (-1 if d.phase == Phase.BACKWARD else 1)


def ranks_without_steps(run: str | Path) -> list[int]:
    """The ranks of ``run`` that completed no step, so nothing of theirs can be compared: no ``step`` event (the
    Tracer writes one as each step ends) and, in a log without such events, tensors of no step it finished (a
    log that failed or crashed leaves its last step unfinished). Reads a rank only up to its first ``step``
    event. `sdc diff` counts completed steps the same way (`pipelines.log_source`)."""
    out = []
    for rank in list_ranks(Path(run)):
        reader = LogReader(rank_dir(Path(run), rank))
        steps: set[int] = set()
        for r in reader.records():
            if isinstance(r, EventRecord) and r.kind == "step":
                break
            if isinstance(r, TensorRecord):
                steps.add(r.step)
        else:
            end = reader.status.end
            finished = end is not None and end.status != "failed"  # closed, and not because training raised
            if not steps or (not finished and max(steps) == 0):
                out.append(rank)
    return out
