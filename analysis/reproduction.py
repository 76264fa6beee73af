"""The reproduction table: each finding of the reference study beside ours, the query behind ours, and a verdict.

    rep = build_reproduction({"rq1": Path("fleet/rq1/study.duckdb"), "rq2": ..., "rq3": ...})
    write_reproduction(rep, Path("fleet/reproduction.md"), Path("fleet/report"), part_reports)

One `Finding` per statement of "Understanding Silent Data Corruption in LLM Training" (ACL
2025) that a fleet study can test. Each reads one named query (analysis/queries) on one
experiment's database and judges its rows with a rule written next to it: *reproduced* (the
rule holds), *not reproduced* (it does not), *different* (a number the study gives, ours of
another size), or *not measured* (the query has no rows: the experiment did not run or
holds no such node). No finding is dropped: a row whose query fails says so.

Nodes are the fleet's unhealthy ones: pairs whose suspect was emulated with a fault profile
other than healthy-node, the trigger node and the baseline twin aside. Output is
deterministic (no clock, no paths of this machine), so two runs of a study give the same bytes.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from analysis.queries import LIBRARY, QueryLibrary
from tracer.errors import SdcError

Outcome = Literal["reproduced", "not reproduced", "different", "not measured"]
OUTCOMES: tuple[Outcome, ...] = ("reproduced", "not reproduced", "different", "not measured")
Rows = list[dict[str, Any]]
TRIGGER, BASELINE = "trigger-ulp", "golden-twin"


@dataclass(frozen=True)
class Verdict:
    ours: str  # our number or statement, in words
    outcome: Outcome


@dataclass(frozen=True)
class Finding:
    level: str  # RQ1, RQ2 or RQ3
    study: str  # what the study found, as it says it
    part: str  # the experiment whose database answers it: rq1, rq2 or rq3
    query: str  # the named query
    rule: str  # how the verdict is decided, in words
    judge: Callable[[Rows], Verdict]
    needs_rows: bool = True  # False: no rows is an answer the judge gives (no spike at all), not "not measured"


@dataclass(frozen=True)
class Row:
    finding: Finding
    verdict: Verdict


@dataclass(frozen=True)
class Reproduction:
    rows: tuple[Row, ...]

    def counts(self) -> dict[str, int]:
        """Outcome -> rows with it, in OUTCOMES order, outcomes with no row left out."""
        out = {o: sum(r.verdict.outcome == o for r in self.rows) for o in OUTCOMES}
        return {o: n for o, n in out.items() if n}


# -- judges: one per finding, each from its query's rows ------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def _fleet(rows: Rows) -> Rows:
    return [r for r in rows if r.get("node_label") not in (TRIGGER, BASELINE)]


def _silent_nodes(rows: Rows) -> Verdict:
    nodes = _fleet(rows)
    if not nodes:
        return Verdict("no unhealthy node", "not measured")
    silent = sorted(r["node_label"] for r in nodes if r["mismatching_calls"] == 0)
    ours = (f"{len(silent)} of {len(nodes)} nodes show no mismatch in the {nodes[0]['steps_replayed']}-step window"
            + (f" ({', '.join(silent)})" if silent else ""))
    return Verdict(ours, "reproduced" if 0 < len(silent) < len(nodes) else "not reproduced")


def _frequent_nodes(rows: Rows) -> Verdict:
    nodes = _fleet(rows)
    frequent = sorted((r for r in nodes if r["steps_mismatching"] >= r["steps_replayed"] / 2),
                      key=lambda r: -r["frequency"])
    active = [r["frequency"] for r in nodes if r["mismatching_calls"] > 0]
    spread = max(active) / min(active) if active and min(active) > 0 else None
    ours = (f"{len(frequent)} of {len(nodes)} nodes mismatch on at least half the steps"
            + (f" ({', '.join(r['node_label'] for r in frequent)})" if frequent else "")
            + (f"; element mismatch frequency spans {spread:.3g}x across the nodes with any" if spread else ""))
    return Verdict(ours, "reproduced" if 0 < len(frequent) <= max(1, len(nodes) // 3) else "not reproduced")


def _bursts(rows: Rows) -> Verdict:
    nodes = [r for r in _fleet(rows) if r["steps_mismatching"] >= 2]
    bursty = [r for r in nodes if r["fano"] is not None and r["fano"] > 1]
    fanos = sorted(r["fano"] for r in nodes if r["fano"] is not None)
    ours = (f"{len(bursty)} of {len(nodes)} nodes with mismatches on 2+ steps have a Fano factor > 1 "
            f"(median {statistics.median(fanos):.3g})" if fanos else "no node mismatches on 2 or more steps")
    return Verdict(ours, "reproduced" if nodes and 2 * len(bursty) > len(nodes) else "not reproduced")


def _small(rows: Rows) -> Verdict:
    severities = [r["median_severity"] for r in _fleet(rows) if r["median_severity"] is not None]
    if not severities:
        return Verdict("no mismatching call", "not measured")
    median = statistics.median(severities)
    ours = f"median over nodes of the median relative difference of mismatching calls: {median:.3g}"
    return Verdict(ours, "reproduced" if median < 0.01 else "not reproduced")


def _heavy_tail(rows: Rows) -> Verdict:
    nodes = _fleet(rows)
    heavy = sorted(r["node_label"] for r in nodes if (r["max_rel"] or 0) >= 100)
    worst = max((r["max_rel"] or 0 for r in nodes), default=0)
    ours = f"{len(heavy)} of {len(nodes)} nodes have an element 100x or more off (largest {worst:.3g}x)"
    return Verdict(ours, "reproduced" if heavy else "not reproduced")


def _abft(rows: Rows) -> Verdict:
    nodes = [r for r in _fleet(rows) if r["faults"] > 0]
    if not nodes:
        return Verdict("no node had a fault injected in the window", "not measured")
    low = [r for r in nodes if r["abft_recall"] < 0.5]
    recalls = ", ".join(f"{r['node_label']} {r['abft_recall']:.2f}" for r in nodes)
    outside = sum(r["faults_outside_matmul"] for r in nodes) / sum(r["faults"] for r in nodes)
    below = sum(r["faults_below_bound"] for r in nodes) / sum(r["faults"] for r in nodes)
    ours = (f"ABFT flags under half of the faults on {len(low)} of {len(nodes)} nodes with faults "
            f"({_pct(len(low) / len(nodes))}); of all faults {_pct(outside)} were outside matmul and {_pct(below)} "
            f"below its bound; recall per node: {recalls}")
    return Verdict(ours, "reproduced" if 2 * len(low) > len(nodes) else "not reproduced")


def _noise(rows: Rows) -> Verdict:
    nodes = _fleet(rows)
    if not nodes:
        return Verdict("no parameter-sync replay", "not measured")
    worst = max(nodes, key=lambda r: r["worst_ratio"])
    median = statistics.median(r["worst_ratio"] for r in nodes)
    ours = (f"worst {_pct(worst['worst_ratio'])} ({worst['node_label']}, step {worst['worst_step']}); "
            f"median node's worst {_pct(median)}")
    if median >= 0.01:
        return Verdict(ours, "not reproduced")  # the study: small in most cases
    return Verdict(ours, "reproduced" if 0.051 / 2 <= worst["worst_ratio"] <= 0.051 * 2 else "different")


def _is_fleet_node(label: str | None) -> bool:
    """The fleet study's unhealthy nodes are node-01, node-02, ...; node-00 is the healthy twin."""
    return bool(label) and label.startswith("node-") and label != "node-00"


def _overlap(rows: Rows) -> Verdict:
    baseline = next((r for r in rows if r["kind"] == "baseline"), None)
    nodes = [r for r in rows if r["kind"] == "fleet" and r["faults"] > 0 and r["mean_abs_loss_diff"] is not None]
    if baseline is None or not nodes:
        return Verdict("no baseline pair or no node with faults", "not measured")
    loss = statistics.median(r["mean_abs_loss_diff"] for r in nodes)
    drifting = [r for r in nodes if (r["final_drift"] or 0) > 0]
    drift = statistics.median(r["final_drift"] or 0 for r in nodes)
    ours = (f"median node with faults: mean |relative loss difference| {loss:.3g} vs the shuffle-seed twin's "
            f"{baseline['mean_abs_loss_diff']:.3g}; {len(drifting)} of {len(nodes)} nodes drift (median final "
            f"drift {drift:.3g}, the twin's {baseline['final_drift']:.3g})")
    overlap = loss <= baseline["mean_abs_loss_diff"]
    return Verdict(ours, "reproduced" if overlap and 2 * len(drifting) > len(nodes) else "not reproduced")


def _drift_rates(rows: Rows) -> Verdict:
    r = rows[0]
    if not r["nodes"] or r["nodes"] < 2:
        return Verdict("fewer than two nodes with a measurable drift rate", "not measured")
    ours = (f"drift rates of {r['nodes']} nodes span {r['rate_ratio']:.3g}x (median {r['median_rate']:.3g} per step, "
            f"e-fold every {1 / r['median_rate']:.3g} steps) while their SDC rates span {r['sdc_rate_ratio']:.3g}x "
            f"({r['sdc_rate_decades']:.2g} decades)")
    if r["sdc_rate_ratio"] is None or r["sdc_rate_ratio"] < 10:
        return Verdict(ours + "; the SDC rates do not differ enough to tell", "not measured")
    return Verdict(ours, "reproduced" if r["rate_ratio"] <= 3 else "not reproduced")


def _trigger(rows: Rows) -> Verdict:
    r = rows[0]
    if r["trigger_rate"] is None:
        return Verdict("the trigger's single-ulp flip left no measurable drift (absorbed by rounding)", "not measured")
    if not r["median_rate"]:
        return Verdict("no fleet node has a measurable drift rate", "not measured")
    ours = (f"one single-ulp flip grows at {r['trigger_rate']:.3g} per step, {r['trigger_over_median']:.3g}x the "
            f"fleet's median rate")
    return Verdict(ours, "reproduced" if 0.5 <= r["trigger_over_median"] <= 2 else "not reproduced")


def _sharpness(rows: Rows) -> Verdict:
    pairs = [(r["sharpness"], r["local_median_rate"]) for r in rows
             if r["sharpness"] is not None and r["local_median_rate"] is not None]
    values = [r["sharpness"] for r in rows if r["sharpness"] is not None]
    if len(pairs) < 3:
        return Verdict(f"sharpness {min(values, default=0):.3g}-{max(values, default=0):.3g}; fewer than three "
                       "checkpoints with a local drift rate", "not measured")
    rho = _spearman(pairs)
    ours = (f"top Hessian eigenvalue {min(values):.3g}-{max(values):.3g} over the golden run's checkpoints; Spearman "
            f"correlation with the fleet's local drift rate {rho:.2f} over {len(pairs)} checkpoints")
    return Verdict(ours, "reproduced" if rho > 0 else "not reproduced")


def _spearman(pairs: list[tuple[float, float]]) -> float:
    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        out = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    a, b = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    return statistics.correlation(a, b) if len(set(a)) > 1 and len(set(b)) > 1 else 0.0


def _spikes(rows: Rows) -> Verdict:
    spiked = sorted({r["node_label"] for r in rows if r["side"] == "suspect" and _is_fleet_node(r["node_label"])})
    ours = f"{len(spiked)} fleet node(s) with a loss spike in pretraining or fine-tuning" + (
        f" ({', '.join(spiked)})" if spiked else "")
    return Verdict(ours, "reproduced" if spiked else "not reproduced")


def _accuracy(rows: Rows) -> Verdict:
    learnt = {r["task"] for r in rows if r["role"] == "golden" and not r["collapsed"]}
    nodes = [r for r in rows if r["role"] == "suspect" and _is_fleet_node(r["node_label"]) and r["task"] in learnt]
    twin = [r for r in rows if r["role"] == "twin" and r["task"] in learnt]
    destroyed = {r["node_label"] for r in nodes if r["collapsed"] and r["accuracy"] <= r["chance"]}
    kept = [r for r in nodes if r["node_label"] not in destroyed]
    if not kept:
        return Verdict("golden learnt no task above chance, or no fleet node was fine-tuned", "not measured")
    close = [r for r in kept if not r["below_golden"]]
    gap = statistics.median(abs(r["accuracy_vs_golden"]) for r in kept)
    twin_gap = statistics.median(abs(r["accuracy_vs_golden"]) for r in twin) if twin else None
    ours = (f"{len(close)} of {len(kept)} (node, task) results on the {len(learnt)} tasks golden learnt are not "
            f"significantly below golden; median |accuracy - golden| {_pct(gap)}"
            + (f", the shuffle-seed twin's {_pct(twin_gap)}" if twin_gap is not None else "")
            + (f" (nodes with destroyed weights left out: {', '.join(sorted(destroyed))})" if destroyed else ""))
    return Verdict(ours, "reproduced" if len(close) >= 0.8 * len(kept) else "not reproduced")


def _disagreement(rows: Rows) -> Verdict:
    nodes = [r for r in rows if _is_fleet_node(r["suspect_node"]) and r["baseline_disagreement"]
             and r["suspect_accuracy"] is not None and r["suspect_accuracy"] > 1 / 4]
    if not nodes:
        return Verdict("no twin baseline or no node above chance", "not measured")
    ratio = statistics.median(r["disagreement"] / r["baseline_disagreement"] for r in nodes)
    ours = (f"median over (node, task) of disagreement with golden / the shuffle-seed twin's: {ratio:.3g} "
            f"(median disagreement {_pct(statistics.median(r['disagreement'] for r in nodes))}, twin "
            f"{_pct(statistics.median(r['baseline_disagreement'] for r in nodes))})")
    return Verdict(ours, "reproduced" if 0.5 <= ratio <= 2 else "not reproduced")


def _destroyed(rows: Rows) -> Verdict:
    nodes = [r for r in rows if r["role"] == "suspect" and _is_fleet_node(r["node_label"])]
    down = sorted({(r["node_label"], r["task"], r["accuracy"], r["chance"]) for r in nodes
                   if r["collapsed"] and r["accuracy"] <= r["chance"] and r["golden_accuracy"] > r["chance"]})
    if not down:
        return Verdict("no fleet node fell to chance where golden learnt the task", "not reproduced")
    shown = "; ".join(f"{n} {t} {_pct(a)} (chance {_pct(c)})" for n, t, a, c in down[:6])
    return Verdict(f"at or below chance where golden learnt the task: {shown}"
                   + (f"; {len(down) - 6} more" if len(down) > 6 else ""), "reproduced")


FINDINGS: tuple[Finding, ...] = (
    Finding("RQ1", "SDC's impact varies by node; nodes 2 and 3 showed no SDC in the window", "rq1", "rq1_fleet_nodes",
            "at least one node, but not all, has no mismatching site call in the lockstep window", _silent_nodes),
    Finding("RQ1", "a few nodes (10, 11) had a high mismatch frequency", "rq1", "rq1_fleet_nodes",
            "between one node and a third of the nodes mismatch on at least half the replayed steps", _frequent_nodes),
    Finding("RQ1", "SDC comes in bursts rather than at a steady rate", "rq1", "rq1_fleet_nodes",
            "most nodes with mismatches on two or more steps have a Fano factor (variance / mean of the per-step "
            "count of mismatching calls) above 1, the value of a steady Poisson rate", _bursts),
    Finding("RQ1", "in most cases the perturbation of a submodule's output is small", "rq1", "rq1_fleet_nodes",
            "the median over nodes of the median relative difference of mismatching calls is below 1 %", _small),
    Finding("RQ1", "some elements were hundreds to thousands of times off", "rq1", "rq1_fleet_nodes",
            "at least one node has an element with a relative difference of 100 or more", _heavy_tail),
    Finding("RQ1", "ABFT failed to flag the SDC on most unhealthy nodes", "rq1", "rq1_fleet_nodes",
            "ABFT's recall (faults flagged / faults injected) is below 0.5 on more than half of the nodes with "
            "faults", _abft),
    Finding("RQ2", "per-step gradient noise-to-signal is small in most cases; the worst was about 5.1 % (node 11)",
            "rq2", "rq2_fleet_nodes",
            "the median node's worst ratio is below 1 % (else not reproduced), and the fleet's worst lies within "
            "a factor 2 of 5.1 % (else different)", _noise),
    Finding("RQ3", "without synchronisation the loss curves overlap while the parameters drift away", "rq3",
            "rq3_fleet_nodes",
            "the median fleet node with faults differs from golden's loss no more than the shuffle-seed twin does "
            "(mean |relative difference| over the steps), and most such nodes drift", _overlap),
    Finding("RQ3", "the drift rate is similar across nodes despite very different SDC rates", "rq3",
            "rq3_drift_spread",
            "the nodes' drift rates (slope of ln drift over steps, before saturation) span at most 3x while their "
            "SDC rates span 10x or more (fewer than 10x: not measured)", _drift_rates),
    Finding("RQ3", "SDC is only the trigger: the loss surface drives the drift (the study's reading)", "rq3",
            "rq3_drift_spread",
            "a single-ulp flip of one element on an otherwise healthy node grows at 0.5x-2x the fleet's median "
            "drift rate (no measurable drift: not measured)", _trigger),
    Finding("RQ3", "the drift follows the loss surface's sharpness (the study's reading)", "rq3", "rq3_sharpness",
            "the top Hessian eigenvalue at the golden checkpoints correlates positively (Spearman) with the fleet's "
            "drift rate around each checkpoint", _sharpness),
    Finding("RQ3", "SDC can cause spikes in the training loss", "rq3", "rq3_loss_spikes",
            "at least one fleet node's loss spikes in pretraining or fine-tuning", _spikes, needs_rows=False),
    Finding("RQ3", "fine-tuned accuracy stays close to the healthy node's", "rq3", "rq3_finetune_accuracy",
            "on the tasks golden learnt (not collapsed), at least 80 % of the (node, task) results are not "
            "significantly below golden (below_golden), nodes with destroyed weights left out", _accuracy),
    Finding("RQ3", "fine-tuned predictions disagree with the healthy node's about as much as changing only the "
            "data-shuffle seed", "rq3", "rq3_finetune_disagreement",
            "the median over (node, task) above chance of disagreement / the twin's disagreement lies in 0.5-2",
            _disagreement),
    Finding("RQ3", "a spike destroyed one node's weights: its test accuracy fell to 0 (node 6, CosmosQA)", "rq3",
            "rq3_finetune_accuracy",
            "a fleet node's accuracy is at or below chance (collapsed) on a task golden learnt", _destroyed),
)


def build_reproduction(dbs: Mapping[str, Path], *, findings: tuple[Finding, ...] = FINDINGS,
                       library: QueryLibrary = LIBRARY) -> Reproduction:
    """Every finding judged on its experiment's database; a missing database or failing query is a row saying so."""
    rows = []
    for f in findings:
        db = dbs.get(f.part)
        if db is None or not Path(db).is_file():
            rows.append(Row(f, Verdict(f"no {f.part} database", "not measured")))
            continue
        try:
            records = library.run(db, f.query).records()
        except SdcError as e:
            rows.append(Row(f, Verdict(f"the query failed: {e}", "not measured")))
            continue
        if not records and f.needs_rows:
            rows.append(Row(f, Verdict("the query has no rows", "not measured")))
        else:
            rows.append(Row(f, f.judge(records)))
    return Reproduction(tuple(rows))


def to_markdown(rep: Reproduction, title: str) -> str:
    out = [f"# {title}", "",
           'Each row: a finding of "Understanding Silent Data Corruption in LLM Training" (ACL 2025), ours beside '
           "it, the named query that computes ours (`sdc query NAME --db PART/study.duckdb`), and the verdict by the "
           "rule under the table.", "",
           "| # | level | the study | ours | query | verdict |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(rep.rows, 1):
        f = r.finding
        out.append(f"| {i} | {f.level} | {_md(f.study)} | {_md(r.verdict.ours)} | `{f.query}` ({f.part}) | "
                   f"**{r.verdict.outcome}** |")
    out += ["", "Totals: " + ", ".join(f"{n} {o}" for o, n in rep.counts().items()) + ".", "", "## Rules", ""]
    out += [f"{i}. {r.finding.rule}." for i, r in enumerate(rep.rows, 1)]
    return "\n".join(out) + "\n"


def to_html(rep: Reproduction, part_reports: Mapping[str, str]) -> str:
    """A section of the HTML report: the table, the rules, and links to each experiment's report."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{i}</td><td>{e(r.finding.level)}</td><td>{e(r.finding.study)}</td><td>{e(r.verdict.ours)}</td>"
        f"<td><code>{e(r.finding.query)}</code> ({e(r.finding.part)})</td><td class=\"{r.verdict.outcome.replace(' ', '-')}\">"
        f"{e(r.verdict.outcome)}</td></tr>" for i, r in enumerate(rep.rows, 1))
    links = " ".join(f'<a href="{e(href)}">{e(part)} report</a>' for part, href in part_reports.items())
    rules = "".join(f"<li>{e(r.finding.rule)}</li>" for r in rep.rows)
    return (f'<section id="reproduction"><h2>Reproduction of the study</h2><p>{links}</p>'
            "<table><tr><th>#</th><th>level</th><th>the study</th><th>ours</th><th>query</th><th>verdict</th></tr>"
            f"{rows}</table><h3>Rules</h3><ol>{rules}</ol></section>")


def write_reproduction(rep: Reproduction, markdown: Path, report: Path, part_reports: Mapping[str, Path],
                       title: str = "Reproduction of the SDC study on an emulated fleet") -> None:
    """`markdown` and ``report/index.html``, the latter linking each experiment's report relative to it."""
    markdown.write_text(to_markdown(rep, title), encoding="utf-8")
    report.mkdir(parents=True, exist_ok=True)
    links = {part: _relative_link(path / "index.html", report) for part, path in part_reports.items()}
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>\n"
            f"{to_html(rep, links)}\n</body></html>\n")
    (report / "index.html").write_text(page, encoding="utf-8")


def _relative_link(target: Path, start: Path) -> str:
    import os

    return Path(os.path.relpath(target, start)).as_posix()


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_CSS = ("body{font-family:sans-serif;max-width:80em;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.3em;vertical-align:top}.reproduced{background:#dfd}"
        ".not-reproduced{background:#fdd}.different{background:#ffd}.not-measured{background:#eee}")
