"""The stability check reads every model's verdicts from reproduction.md and fails only on an unmarked flip."""

from __future__ import annotations

from pathlib import Path

from analysis import reproduction_stability as stability
from analysis.reproduction import FINDINGS, Reproduction, Row, models_markdown, to_markdown
from analysis.reproduction_provenance import Provenance
from analysis.reproduction_rules import Outcome, Verdict


def table(*verdicts: tuple[Outcome, str]) -> Reproduction:
    """A reproduction whose first rows have these (outcome, unstable) verdicts."""
    return Reproduction(
        tuple(
            Row(f, Verdict("ours | with a bar", outcome, unstable), Provenance("emergent", "why"))
            for f, (outcome, unstable) in zip(FINDINGS, verdicts)
        )
    )


def test_reads_every_models_verdicts_from_the_markdown() -> None:
    study = table(("reproduced", ""), ("not reproduced", "a node within the margin"))
    hardware = table(("not measured", ""), ("reproduced", ""))
    read = stability.read_verdicts(models_markdown({"study": study, "hardware": hardware}, "t"))
    assert read == {  # rows 1 and 2 are recovery rows: consistent or not with what was injected
        ("study", 1): stability.Verdict("consistent", False),
        ("study", 2): stability.Verdict("not consistent", True),
        ("hardware", 1): stability.Verdict("not measured", False),
        ("hardware", 2): stability.Verdict("consistent", False),
    }
    assert stability.read_verdicts(to_markdown(study, "t")) == {
        ("fleet", 1): stability.Verdict("consistent", False),
        ("fleet", 2): stability.Verdict("not consistent", True),
    }


def test_a_flip_passes_only_where_a_run_marked_the_row_unstable(tmp_path: Path, capsys) -> None:
    a, b, c = tmp_path / "a.md", tmp_path / "b.md", tmp_path / "c.md"
    a.write_text(to_markdown(table(("reproduced", ""), ("not reproduced", "near")), "t"))
    b.write_text(to_markdown(table(("reproduced", ""), ("reproduced", "")), "t"))  # row 2 flips, marked in a
    c.write_text(to_markdown(table(("not reproduced", ""), ("not reproduced", "")), "t"))  # row 1 flips, unmarked
    assert stability.main([str(a), str(b)]) == 0
    assert "2 of 2 rows stable" in capsys.readouterr().out
    assert stability.main([str(b), str(c)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS, not marked unstable" in out and "unstable and unmarked: fleet 1" in out
    rows = stability.compare(stability.read_verdicts(a.read_text()), {})
    assert [r.stable for r in rows] == [False, False]  # a row missing from one table is no agreement
