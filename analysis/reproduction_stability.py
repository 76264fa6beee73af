"""Whether two runs of a fleet study give the same verdict on every row: the reproduction's stability check.

    python -m analysis.reproduction_stability A/reproduction.md B/reproduction.md    # exit 0: stable, 1: not
    compare(read_verdicts(a), read_verdicts(b))      # one `RowComparison` per (fault model, row)

Two runs whose float bits differ (two machines, or one machine with another vector width of ATen's CPU
kernels: ``ATEN_CPU_CAPABILITY=avx2`` on an AVX512 CPU) must give the same verdict on every row, or mark the row
unstable in at least one of them (its number lies within its rule's margin, analysis/reproduction_rules.py). A
row that flips without such a mark is a rule whose margin is too narrow: the check fails and names it. Another
thread count is no such test: at the fleet's sizes it changes no bits. docs/study.md, "Stability", gives the
commands.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

_MODEL = re.compile(r"^## The (\S+) fault model$")
_VERDICT = re.compile(r"^\*\*(?P<outcome>[^*]+)\*\*(?: \(unstable: (?P<why>.*)\))?$")


@dataclass(frozen=True)
class Verdict:
    outcome: str
    unstable: bool


@dataclass(frozen=True)
class RowComparison:
    model: str
    row: int
    first: Verdict | None  # None: the row is missing from that table
    second: Verdict | None

    @property
    def same(self) -> bool:
        return self.first is not None and self.second is not None and self.first.outcome == self.second.outcome

    @property
    def stable(self) -> bool:
        """The same outcome, or a different one that either run marked unstable."""
        marked = any(v is not None and v.unstable for v in (self.first, self.second))
        return self.same or (marked and self.first is not None and self.second is not None)


def read_verdicts(markdown: str) -> dict[tuple[str, int], Verdict]:
    """(fault model, row number) -> its verdict, from a reproduction.md (`analysis.reproduction.models_markdown`);
    a file with one model's table names it "fleet"."""
    model, out = "fleet", {}
    for line in markdown.splitlines():
        heading = _MODEL.match(line)
        if heading:
            model = heading.group(1)
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 9 and cells[0].isdigit():  # a model's own table: # kind level study ours measured-vs-injected
            match = _VERDICT.match(cells[8])  # query provenance verdict
            if match:
                out[model, int(cells[0])] = Verdict(match.group("outcome"), match.group("why") is not None)
    return out


def compare(first: dict[tuple[str, int], Verdict], second: dict[tuple[str, int], Verdict]) -> list[RowComparison]:
    """Every (model, row) of either run, in order, with both verdicts."""
    return [
        RowComparison(model, row, first.get((model, row)), second.get((model, row)))
        for model, row in sorted(first.keys() | second.keys(), key=lambda k: (k[0] != "fleet", k[0], k[1]))
    ]


def _words(v: Verdict | None) -> str:
    return "missing" if v is None else v.outcome + (" (unstable)" if v.unstable else "")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m analysis.reproduction_stability A/reproduction.md B/reproduction.md", file=sys.stderr)
        return 2
    rows = compare(*(read_verdicts(Path(a).read_text(encoding="utf-8")) for a in args))
    for r in rows:
        state = "same" if r.same else ("differs, marked unstable" if r.stable else "DIFFERS, not marked unstable")
        print(f"{r.model:>10} row {r.row:>2}: {_words(r.first):<32} {_words(r.second):<32} {state}")
    bad = [r for r in rows if not r.stable]
    print(
        f"{len(rows) - len(bad)} of {len(rows)} rows stable"
        + (f"; unstable and unmarked: {', '.join(f'{r.model} {r.row}' for r in bad)}" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
