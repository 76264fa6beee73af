"""The reproduction table: each finding of the reference study beside ours, the query behind ours, and a verdict.

    rep = build_reproduction({"rq1": Path("fleet/rq1/study.duckdb"), "rq2": ..., "rq3": None})  # None: not run
    write_reproduction({"study": rep, "hardware": ...}, Path("fleet/reproduction.md"), Path("fleet/report"),
                       part_reports)    # {("study", "rq1"): Path("fleet/rq1/report"), ...}

One `Finding` per statement of "Understanding Silent Data Corruption in LLM Training" (ACL
2025) that a fleet study can test. Each reads one named query (analysis/queries) on one
experiment's database and judges its rows with a rule (analysis/reproduction_rules.py):
*reproduced* (the rule holds), *not reproduced* (it does not), *different* (a number the
study gives, ours of another size), or *not measured* (the query has no rows: the experiment
did not run or holds no such node), marked *unstable* where the number lies within the rule's
margin of its threshold. Each row also says where the finding comes from, *built in*,
*calibrated* or *emergent*, decided from the fleet's fault profiles
(analysis/reproduction_provenance.py). No finding is dropped: a row whose query fails says so.

Nodes are the fleet's unhealthy ones: pairs whose suspect was emulated with a fault profile
other than healthy-node, the trigger node and the baseline twin aside. Output is
deterministic (no clock, no paths of this machine), so two runs of a study give the same bytes.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from analysis import reproduction_provenance as prov
from analysis import reproduction_recovery as rec
from analysis import reproduction_rules as rules
from analysis.queries import LIBRARY, QueryLibrary
from analysis.reproduction_provenance import Provenance
from analysis.reproduction_recovery import Recovery
from analysis.reproduction_rules import OUTCOMES, Rows, Verdict
from tracer.errors import SdcError

PROFILES = ("rq1", "rq1_fleet_profiles")  # where the provenance column reads the fleet's fault rules


@dataclass(frozen=True)
class Finding:
    level: str  # RQ1, RQ2 or RQ3
    study: str  # what the study found, as it says it
    part: str  # the experiment whose database answers it: rq1, rq2 or rq3
    query: str  # the named query
    rule: str  # how the verdict is decided, in words
    judge: Callable[[Rows], Verdict]
    provenance: Callable[[Rows], Provenance]  # from the fleet's fault rules (rq1_fleet_profiles)
    needs_rows: bool = True  # False: no rows is an answer the judge gives (no spike at all), not "not measured"
    # a row about what the fault model injects: its measured numbers beside the injected ground truth (None: a row
    # about what training does)
    recover: Callable[[Rows, Rows], Recovery] | None = None

    @property
    def kind(self) -> str:
        """RECOVERY (the fault model fixes the outcome: the verdict says whether the study's finding is consistent
        with what was injected) or FINDING (what training does: reproduced or not, with its margin)."""
        return RECOVERY if self.recover is not None else FINDING


RECOVERY, FINDING = "recovery", "finding"
KIND_WORDS = {
    RECOVERY: "RECOVERY of what the fault model injects",
    FINDING: "FINDING about what training does",
}
CONSISTENT = {"reproduced": "consistent", "not reproduced": "not consistent"}  # a recovery row's outcome, in words


@dataclass(frozen=True)
class Row:
    finding: Finding
    verdict: Verdict
    provenance: Provenance
    recovery: Recovery | None = None  # a recovery row's measured numbers beside the injected ones

    @property
    def outcome(self) -> str:
        """The verdict in the row's own words: consistent / not consistent for a recovery row."""
        if self.finding.kind == RECOVERY:
            return CONSISTENT.get(self.verdict.outcome, self.verdict.outcome)
        return self.verdict.outcome


@dataclass(frozen=True)
class Reproduction:
    rows: tuple[Row, ...]

    def counts(self, kind: str | None = None) -> dict[str, int]:
        """Outcome -> rows with it (of one kind of row, or all), in OUTCOMES order, outcomes with no row left out;
        a recovery row's outcome in its own words (consistent, not consistent)."""
        rows = [r for r in self.rows if kind is None or r.finding.kind == kind]
        out = {o: sum(r.outcome == o for r in rows) for o in (*CONSISTENT.values(), *OUTCOMES)}
        return {o: n for o, n in out.items() if n}

    def unstable(self) -> int:
        """Rows whose number lies within their rule's margin of its threshold."""
        return sum(bool(r.verdict.unstable) for r in self.rows)

    def totals(self) -> str:
        """The counts in words by kind of row, e.g. "recovery rows: 6 consistent, 2 not consistent; finding rows:
        3 reproduced, 4 not reproduced; 2 unstable"."""
        parts = []
        for kind in (RECOVERY, FINDING):
            counts = self.counts(kind)
            if counts:
                parts.append(f"{kind} rows: " + ", ".join(f"{n} {o}" for o, n in counts.items()))
        return "; ".join(parts) + (f"; {self.unstable()} unstable" if self.unstable() else "")


FINDINGS: tuple[Finding, ...] = (
    Finding(
        "RQ1",
        "SDC's impact varies by node; nodes 2 and 3 showed no SDC in the window",
        "rq1",
        "rq1_fleet_nodes",
        "the number of nodes with no mismatching site call in the lockstep window is at least 1 and inside the "
        "95 % acceptance interval of Binomial(nodes, 2/15), the study's proportion; margin: a node with faults "
        "but no mismatch, or one mismatch",
        rules.silent_nodes,
        prov.rate_spread,
        recover=rec.silence,
    ),
    Finding(
        "RQ1",
        "a few nodes (10, 11) had a high mismatch frequency",
        "rq1",
        "rq1_fleet_nodes",
        "the number of nodes mismatching on at least half the replayed steps is at least 1 and inside the 95 % "
        "acceptance interval of Binomial(nodes, 2/15); margin: a node within one step of half",
        rules.frequent_nodes,
        prov.rate_spread,
        recover=rec.frequency,
    ),
    Finding(
        "RQ1",
        "SDC comes in bursts rather than at a steady rate",
        "rq1",
        "rq1_fleet_nodes",
        "more than half of the nodes with faults on 2+ replayed steps have a Fano factor of injected faults per "
        "step above the 95 % quantile a steady Poisson rate with the same mean shows over as many steps "
        "(dispersion test: steps x Fano ~ chi-square(steps - 1)); margin: a node within 10 % of its bound",
        rules.bursts,
        prov.injected_counts,
        recover=rec.dispersion,
    ),
    Finding(
        "RQ1",
        "in most cases the perturbation of a submodule's output is small",
        "rq1",
        "rq1_fleet_nodes",
        "the median over nodes of the median relative difference of mismatching calls is below 1 %; margin: a factor 2",
        rules.small,
        prov.small_flips,
        recover=rec.severity,
    ),
    Finding(
        "RQ1",
        "some elements were hundreds to thousands of times off",
        "rq1",
        "rq1_fleet_nodes",
        "at least one node has an element with a relative difference of 100 or more; margin: a node within a "
        "factor 1.25 of 100",
        rules.heavy_tail,
        prov.heavy_tail,
        recover=rec.tail,
    ),
    Finding(
        "RQ1",
        "ABFT failed to flag the SDC on most unhealthy nodes",
        "rq1",
        "rq1_fleet_nodes",
        "ABFT's recall (faults flagged / faults injected) is below 0.5 on more than half of the nodes with "
        "faults; margin: a node's recall within 0.1 of 0.5",
        rules.abft,
        prov.outside_matmul,
        recover=rec.abft_recall,
    ),
    Finding(
        "RQ2",
        "per-step gradient noise-to-signal is small in most cases; the worst was about 5.1 % (node 11)",
        "rq2",
        "rq2_fleet_nodes",
        "the median node's worst ratio is below 1 % (else not reproduced), and the fleet's worst lies within "
        "a factor 2 of 5.1 % (else different); margin: a factor 1.25 around each bound",
        rules.noise,
        prov.tail_rate,
        recover=rec.noise,
    ),
    Finding(
        "RQ3",
        "without synchronisation the loss curves overlap while the parameters drift away",
        "rq3",
        "rq3_fleet_nodes",
        "the median fleet node with faults differs from golden's loss no more than the shuffle-seed twin does "
        "(mean |relative difference| over the steps), and more than half of those nodes drift: final drift above "
        "the float noise, the larger of the healthy twin's drift and float32's unit roundoff 2^-24; margins: a "
        "factor 1.25 on the loss, a factor 2 on a node's drift",
        rules.overlap,
        prov.emergent,
    ),
    Finding(
        "RQ3",
        "the drift rate is similar across nodes despite very different SDC rates",
        "rq3",
        "rq3_drift_spread",
        "the nodes' drift rates (slope of ln drift over steps, before saturation) span at most 3x while their "
        "SDC rates span 10x or more (fewer than 10x: not measured); margin: 10 % of 3x",
        rules.drift_rates,
        prov.emergent,
    ),
    Finding(
        "RQ3",
        "SDC is only the trigger: the loss surface drives the drift (the study's reading)",
        "rq3",
        "rq3_drift_spread",
        "a single-ulp flip of one element on an otherwise healthy node grows at 0.5x-2x the fleet's median "
        "drift rate (no measurable drift: not measured); margin: 10 % of either bound",
        rules.trigger,
        prov.emergent,
    ),
    Finding(
        "RQ3",
        "the drift follows the loss surface's sharpness (the study's reading)",
        "rq3",
        "rq3_sharpness",
        "Spearman's rho between the top Hessian eigenvalue at the golden checkpoints and the fleet's drift rate "
        f"around each, over {rules.MIN_CHECKPOINTS} or more checkpoints, with its 95 % interval by Fisher's z "
        "(variance 1.06 / (n - 3)): reproduced when the interval lies above 0, not reproduced when it lies below "
        f"{rules.FOLLOWS:g}; margin: an interval holding both answers (undecided, marked unstable)",
        rules.sharpness,
        prov.emergent,
    ),
    Finding(
        "RQ3",
        "SDC can cause spikes in the training loss",
        "rq3",
        "rq3_loss_spikes",
        "at least one fleet node's loss spikes (pretraining or fine-tuning) at a step where golden has none, "
        f"with a drawn fault at that step or up to {rules.SPIKE_WINDOW} steps before; a scripted node's spikes at "
        "and after its first scripted step (the destroyer's) are reported apart and never counted; the null: "
        "every healthy twin diffed against golden (the pretraining shuffle-seed twin, every fine-tune twin, "
        "node-00) must show no spike golden lacks, else the finding is seen without SDC and is not reproduced; "
        "margin: every counted spike, or every twin's, below 1.1 x the spike threshold",
        rules.spikes,
        prov.emergent,
        needs_rows=False,
    ),
    Finding(
        "RQ3",
        "fine-tuned accuracy stays close to the healthy node's",
        "rq3",
        "rq3_finetune_accuracy",
        f"on the tasks golden learnt (at least {100 * rules.LEARNT:.0f} points above chance, not collapsed), the "
        "(node, task) results below all n shuffle-seed twins' accuracies number no more than the 95 % upper "
        "bound of Binomial(results, 1/(n+1)), the chance of a healthy fine-tune being lowest of n+1; nodes with "
        f"destroyed weights left out; margin: a result within {100 * rules.ACCURACY_MARGIN:g} point of the "
        "twins' lowest",
        rules.accuracy,
        prov.emergent,
    ),
    Finding(
        "RQ3",
        "fine-tuned predictions disagree with the healthy node's about as much as changing only the data-shuffle seed",
        "rq3",
        "rq3_finetune_disagreement",
        "the (node, task) results above chance whose disagreement with golden lies outside the n shuffle-seed "
        "twins' range number no more than the 95 % upper bound of Binomial(results, 2/(n+1)), the chance of a "
        f"twin falling outside the others' range; margin: a result within {100 * rules.DISAGREEMENT_MARGIN:g} "
        "point of either end",
        rules.disagreement,
        prov.emergent,
    ),
    Finding(
        "RQ3",
        "a spike destroyed one node's weights: its test accuracy fell to 0 (node 6, CosmosQA)",
        "rq3",
        "rq3_finetune_accuracy",
        f"a fleet node's accuracy is at or below chance (collapsed) on a task golden and every shuffle-seed "
        f"twin learnt (at least {100 * rules.LEARNT:.0f} points above chance); margin: a node within 2 points "
        "above chance",
        rules.destroyed,
        prov.scripted_destroyer,
        recover=rec.destroyed,
    ),
)


NOT_RUN = "not run for this model"  # a part the fleet study's file did not run for a fault model (dbs[part] None)


def build_reproduction(
    dbs: Mapping[str, Path | None], *, findings: tuple[Finding, ...] = FINDINGS, library: QueryLibrary = LIBRARY
) -> Reproduction:
    """Every finding judged on its experiment's database; a missing database or failing query is a row saying so,
    a part mapped to None (not run for this fault model) a row saying `NOT_RUN`. The provenance column reads the
    fleet's fault rules from the rq1 database (`PROFILES`)."""
    profiles = _records(dbs, *PROFILES, library)
    rows = []
    for f in findings:
        if isinstance(profiles, str) or not profiles:
            provenance = Provenance("unknown", f"no fault profiles to read ({profiles or 'none recorded'})")
        else:
            provenance = f.provenance(profiles)
        records = _records(dbs, f.part, f.query, library)
        if f.part in dbs and dbs[f.part] is None:
            rows.append(
                Row(f, Verdict(f"{NOT_RUN} ({f.part} is not among its experiments)", "not measured"), provenance)
            )
        elif isinstance(records, str):
            rows.append(Row(f, Verdict(records, "not measured"), provenance))
        elif not records and f.needs_rows:
            rows.append(Row(f, Verdict("the query has no rows", "not measured"), provenance))
        else:
            recovery = f.recover(records, profiles if isinstance(profiles, list) else []) if f.recover else None
            rows.append(Row(f, f.judge(records), provenance, recovery))
    return Reproduction(tuple(rows))


def _records(dbs: Mapping[str, Path | None], part: str, query: str, library: QueryLibrary) -> Rows | str:
    """The query's rows on the part's database, or why there are none."""
    db = dbs.get(part)
    if db is None or not Path(db).is_file():
        return f"no {part} database"
    try:
        return library.run(db, query).records()
    except SdcError as e:
        return f"the query failed: {e}"


def _verdict_words(row: Row) -> str:
    v = row.verdict
    return row.outcome + (f" (unstable: {v.unstable})" if v.unstable else "")


def _numbers(rep: Reproduction, kind: str) -> str:
    """The table's row numbers of one kind, e.g. "1-7, 15"."""
    out: list[list[int]] = []
    for i, r in enumerate(rep.rows, 1):
        if r.finding.kind != kind:
            continue
        if out and out[-1][-1] == i - 1:
            out[-1].append(i)
        else:
            out.append([i])
    return ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else f"{g[0]}" for g in out)


def _intro(rep: Reproduction) -> str:
    return (
        f"**Two kinds of row.** **RECOVERY rows ({_numbers(rep, RECOVERY)}) restate the fault model**: faults are "
        "drawn to make silent and frequent nodes, bursts, small and 100-1000x errors, misses outside matmul and a "
        "destroyed fine-tune, so what was injected fixes their outcome. Each shows, per node, what the tool "
        "measured beside what the emulator injected (its fault events, the `faults` table) and the recovery "
        "error; its verdict says only whether the study's finding is *consistent* with that ground truth. They "
        "test the tool's measurement, not the study. "
        f"**FINDING rows ({_numbers(rep, FINDING)}) are about what training does** with the corruption: no fault "
        "rule states them, and their verdict is *reproduced* or *not reproduced* by the rule under the table, with "
        "its margin; only these test the study's findings.\n\n"
        'Each row: a finding of "Understanding Silent Data Corruption in LLM Training" (ACL 2025), ours beside '
        "it, the named query that computes ours (`sdc query NAME --db PART/study.duckdb`), where the finding comes "
        "from (built in: a parameter of the fault model, the project's own choices named as such; calibrated: a "
        "parameter tuned on the study's figure; emergent: out of the training dynamics, read from the fleet's "
        "profiles by `rq1_fleet_profiles`), and the verdict by the rule under the table. A verdict marked unstable "
        "lies within its rule's margin of the threshold: another machine's float bits could flip it."
    )


def to_markdown(rep: Reproduction, title: str) -> str:
    """One fault model's table, its totals and its rules, under the heading `title`."""
    return "\n".join([f"# {title}", "", _intro(rep), "", *_table(rep), "", "## Rules", "", *_rules(rep)]) + "\n"


def models_markdown(reps: Mapping[str, Reproduction], title: str) -> str:
    """Every fault model's verdicts side by side (a column per model), then each model's own table; the rules once.
    One model alone gives `to_markdown`."""
    if len(reps) == 1:
        return to_markdown(next(iter(reps.values())), title)
    first = next(iter(reps.values()))
    out = [
        f"# {title}",
        "",
        _intro(first),
        "",
        "## The verdicts of every fault model",
        "",
        "| # | kind | level | the study | " + " | ".join(reps) + " |",
        "|---|---|---|---|" + "---|" * len(reps),
    ]
    for i, f in enumerate(first.rows, 1):
        cells = [_cell(rep.rows[i - 1]) for rep in reps.values()]
        out.append(
            f"| {i} | {KIND_WORDS[f.finding.kind]} | {f.finding.level} | {_md(f.finding.study)} | "
            + " | ".join(cells)
            + " |"
        )
    out += [""] + [f"Totals, {model}: {rep.totals()}." for model, rep in reps.items()]
    for i, (model, rep) in enumerate(reps.items()):
        fleet_md = "profiles/fleet.md" if i == 0 else f"profiles/{model}/fleet.md"
        out += ["", f"## The {model} fault model", "", *_table(rep)]
        out += [
            "",
            f"The {model} model's drawn nodes: `{fleet_md}`. Where each of its parameters comes from (a source "
            "and the figure it gives, calibrated on the study, or the project's choice): docs/fleet.md.",
        ]
    out += ["", "## Rules", "", *_rules(first)]
    return "\n".join(out) + "\n"


def _cell(row: Row) -> str:
    """A row's verdict in the side-by-side table: the outcome, unstable or not, and the provenance."""
    if row.verdict.ours.startswith(NOT_RUN):
        return NOT_RUN
    return f"**{row.outcome}**{' (unstable)' if row.verdict.unstable else ''} ({row.provenance.kind})"


def _rules(rep: Reproduction) -> list[str]:
    return [f"{i}. {r.finding.rule}." for i, r in enumerate(rep.rows, 1)]


def _recovery_words(row: Row) -> str:
    if row.finding.kind == FINDING:
        return "- (a finding about training: no injected counterpart)"
    if row.recovery is None:
        return "not measured"
    return f"{row.recovery.beside}; recovery error: {row.recovery.error}"


def _table(rep: Reproduction) -> list[str]:
    out = [
        "| # | kind | level | the study | ours | measured vs injected | query | provenance | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rep.rows, 1):
        f, v = r.finding, r.verdict
        out.append(
            f"| {i} | {KIND_WORDS[f.kind]} | {f.level} | {_md(f.study)} | {_md(v.ours)} | {_md(_recovery_words(r))} | "
            f"`{f.query}` ({f.part}) | {r.provenance.kind}: {_md(r.provenance.why)} | **{r.outcome}**"
            + (f" (unstable: {_md(v.unstable)})" if v.unstable else "")
            + " |"
        )
    kinds = {k: sum(r.provenance.kind == k for r in rep.rows) for k in ("built in", "calibrated", "emergent")}
    emergent = sum(r.provenance.kind == "emergent" and r.verdict.outcome == "reproduced" for r in rep.rows)
    out += [
        "",
        f"Totals: {rep.totals()}.",
        "",
        "Provenance: " + ", ".join(f"{n} {k}" for k, n in kinds.items() if n) + "; reproduced among the "
        f"emergent rows: {emergent}.",
    ]
    return out


def to_html(
    rep: Reproduction,
    part_reports: Mapping[str, str],
    heading: str = "Reproduction of the study",
    anchor: str = "reproduction",
) -> str:
    """A section of the HTML report: the two kinds of row in words, the table, the rules, and links to each
    experiment's report."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{i}</td><td>{e(KIND_WORDS[r.finding.kind])}</td><td>{e(r.finding.level)}</td>"
        f"<td>{e(r.finding.study)}</td><td>{e(r.verdict.ours)}</td><td>{e(_recovery_words(r))}</td>"
        f"<td><code>{e(r.finding.query)}</code> ({e(r.finding.part)})</td>"
        f"<td>{e(r.provenance.kind)}: {e(r.provenance.why)}</td>"
        f'<td class="{r.outcome.replace(" ", "-")}">{e(_verdict_words(r))}</td></tr>'
        for i, r in enumerate(rep.rows, 1)
    )
    links = " ".join(f'<a href="{e(href)}">{e(part)} report</a>' for part, href in part_reports.items())
    rules_ = "".join(f"<li>{e(r.finding.rule)}</li>" for r in rep.rows)
    intro = "".join(f"<p>{e(p)}</p>" for p in _intro(rep).replace("**", "").replace("`", "").split("\n\n"))
    return (
        f'<section id="{e(anchor)}"><h2>{e(heading)}</h2><p>{links}</p>{intro}'
        "<table><tr><th>#</th><th>kind</th><th>level</th><th>the study</th><th>ours</th>"
        "<th>measured vs injected</th><th>query</th><th>provenance</th>"
        f"<th>verdict</th></tr>{rows}</table><p>Totals: {e(rep.totals())}.</p><h3>Rules</h3><ol>{rules_}</ol>"
        "</section>"
    )


def write_reproduction(
    reps: Mapping[str, Reproduction],
    markdown: Path,
    report: Path,
    part_reports: Mapping[tuple[str, str], Path],
    title: str = "Reproduction of the SDC study on an emulated fleet",
) -> None:
    """`markdown` (`models_markdown`: every fault model's table) and ``report/index.html``, a section per model
    linking its experiments' reports (`part_reports`, keyed by (model, part)) relative to it."""
    markdown.write_text(models_markdown(reps, title), encoding="utf-8")
    report.mkdir(parents=True, exist_ok=True)
    sections = []
    for model, rep in reps.items():
        links = {
            part: _relative_link(path / "index.html", report) for (m, part), path in part_reports.items() if m == model
        }
        heading = "Reproduction of the study" + (f": the {model} fault model" if len(reps) > 1 else "")
        sections.append(to_html(rep, links, heading, "reproduction" if not sections else f"reproduction-{model}"))
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )
    (report / "index.html").write_text(page, encoding="utf-8")


def _relative_link(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_CSS = (
    "body{font-family:sans-serif;max-width:80em;margin:auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.3em;vertical-align:top}.reproduced{background:#dfd}"
    ".not-reproduced{background:#fdd}.different{background:#ffd}.not-measured{background:#eee}"
    ".consistent{background:#def}.not-consistent{background:#fdd}"
)
