"""The study report: PNG plots and one self-contained ``index.html``, every number read through the named queries.

    build_report("study.duckdb", "report/")   # what `sdc report` runs

One progress-bar step per section:

1. summary: the ``summary`` and ``rq3_first_divergence`` tables;
2. RQ1: mismatch frequency over steps per node, the severity distribution per node,
   bursts, mismatches per site, fault detection by ABFT and fingerprints;
3. RQ2: noise-to-signal per step per node, each node's worst case marked;
4. RQ3: per pair, parameter drift beside the golden and suspect loss curves with loss
   spikes marked; with a drift baseline (``sdc diff --baseline``) or sharpness estimates,
   per golden run the log drift of every node over steps, the baseline dashed, beside the
   golden's sharpness (``rq3_drift_rate``, ``rq3_drift_and_loss``, ``rq3_sharpness``);
5. fine-tuning: accuracy per task and node beside prediction disagreement against the
   shuffle-seed baseline, when ``rq3_finetune_*`` queries exist and their tables hold rows;
6. the guard: each detector scored against the injected faults (``guard_detector_scores``)
   and, for a node recorded with and without the guard, what guarding changed
   (``guard_outcome``).

Plots and `sdc query` read the same queries, so they never disagree. A section or plot
without data says what would fill it. Plots are drawn on matplotlib's Agg canvas through
its object API: no pyplot state, no display.
"""

from __future__ import annotations

import html
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from tqdm import tqdm

from analysis.formats import cell
from analysis.queries import LIBRARY, QueryLibrary, Result, Session
from tracer.errors import UsageError

FINETUNE_QUERIES = ("rq3_finetune_accuracy", "rq3_finetune_disagreement")
FINETUNE_TABLES = ("finetune_eval", "finetune_predictions")
GUARD_QUERIES = ("guard_detector_scores", "guard_outcome")
HTML_ROWS = 200  # rows of one table shown in index.html; `sdc query` prints all


@dataclass
class Section:
    key: str
    title: str
    intro: str
    figures: list[tuple[str, str]] = field(default_factory=list)  # (PNG file name, caption)
    tables: list[tuple[str, Result, bool]] = field(default_factory=list)  # (query, result, folded)
    notes: list[str] = field(default_factory=list)  # what is missing, and what would fill it


@dataclass(frozen=True)
class Report:
    index: Path
    images: list[Path]
    sections: list[Section]


class _Study:
    """The database (one read-only session for the whole report), the output folder and each query's result, run
    once."""

    def __init__(self, session: Session, out: Path) -> None:
        self.session, self.out, self.library = session, out, session.library
        self.db = Path(session.db_path)
        self._results: dict[str, Result] = {}
        self.images: list[Path] = []

    def query(self, name: str) -> Result:
        if name not in self._results:
            self._results[name] = self.session.execute(self.library.sql(name))
        return self._results[name]

    def select(self, sql: str) -> Result:
        return self.session.execute(sql)

    def save(self, fig: Figure, name: str) -> str:
        path = self.out / name
        FigureCanvasAgg(fig)
        fig.savefig(path, dpi=110)
        self.images.append(path)
        return name


def build_report(
    db_path: str | Path, out_dir: str | Path, *, library: QueryLibrary = LIBRARY, progress: bool = True
) -> Report:
    """Write the plots and ``index.html`` of the study in ``db_path`` to ``out_dir``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory; choose another --out")
    with library.session(db_path) as session:  # fails early, before any file is written, on a foreign database
        return _build(_Study(session, out), progress)


def _build(study: _Study, progress: bool) -> Report:
    study.query("summary")
    out, library = study.out, study.library
    out.mkdir(parents=True, exist_ok=True)
    builders: list[Callable[[_Study], Section]] = [_summary, _rq1, _rq2, _rq3, _finetune, _guard]
    sections: list[Section] = []
    bar = tqdm(total=len(builders) + 1, desc="report", unit="section", disable=None if progress else True, leave=False)
    try:
        for build in builders:
            bar.set_postfix_str(build.__name__.strip("_"))
            sections.append(build(study))
            bar.update()
        bar.set_postfix_str("index.html")
        index = out / "index.html"
        index.write_text(_page(study.db, sections, library), encoding="utf-8")
        bar.update()
    finally:
        bar.close()
    return Report(index, study.images, sections)


# -- sections ---------------------------------------------------------------------------
def _summary(study: _Study) -> Section:
    s = Section(
        "summary",
        "Summary",
        "One row per pair of runs: where the suspect first diverged and the "
        "headline number of each research question. The sections below break them down.",
    )
    if not study.query("summary").rows:
        s.notes.append("The database holds no pairs: load one with `sdc diff --golden RUN --suspect RUN --db FILE`.")
        return s
    s.tables += [(name, study.query(name), False) for name in ("summary", "rq3_first_divergence")]
    return s


def _rq1(study: _Study) -> Section:
    s = Section(
        "rq1",
        "RQ1 - submodule mismatches",
        "Lockstep replays run every submodule of the suspect on golden inputs: mismatch frequency is the "
        "share of output elements that differ from the healthy node's, severity the mean relative "
        "difference of those that do. Injected faults are scored against ABFT and fingerprints.",
    )
    by_step = study.query("rq1_mismatch_by_step")
    if by_step.rows:
        fig, ax, _ = _step_lines(by_step, "frequency")
        ax.set(ylabel="mismatch frequency (share of elements)", title="Mismatch frequency over steps, per node")
        s.figures.append((study.save(fig, "rq1_frequency.png"), "Mismatch frequency per replayed step and node."))
        s.figures.extend(_severity_figure(study))
        for name, folded in (
            ("rq1_mismatch_by_node", False),
            ("rq1_mismatch_bursts", False),
            ("rq1_mismatch_by_site", True),
            ("rq1_mismatch_by_step", True),
            ("rq1_mismatch_calls", True),
        ):
            s.tables.append((name, study.query(name), folded))
    else:
        s.notes.append(
            "No lockstep replay is loaded: run `sdc replay --mode lockstep ...` and pass its log to "
            "`sdc diff --replay`."
        )
    faults = study.query("rq1_abft_by_fault_kind")
    if faults.rows:
        s.tables.append(("rq1_abft_by_fault_kind", faults, False))
    else:
        s.notes.append("No injected faults are loaded: record a node with `sdc record --fault-profile ... --abft`.")
    if study.query("rq1_detection_scores").rows:
        s.tables.append(("rq1_detection_scores", study.query("rq1_detection_scores"), False))
    return s


def _severity_figure(study: _Study) -> list[tuple[str, str]]:
    calls = study.query("rq1_mismatch_calls")
    series = {
        label: [r["severity"] for r in rows if r["severity"] and r["severity"] > 0]
        for label, rows in _series(calls).items()
    }
    series = {label: values for label, values in series.items() if values}
    if not series:
        return []
    fig = Figure(figsize=(max(6.0, 1.4 * len(series) + 2), 4), layout="constrained")
    ax = fig.subplots()
    ax.boxplot(list(series.values()), tick_labels=list(series), showmeans=True)
    ax.set_yscale("log")
    ax.set(
        xlabel="suspect node",
        ylabel="mismatch severity (mean relative difference)",
        title="Severity of the mismatching site calls, per node",
    )
    return [
        (
            study.save(fig, "rq1_severity.png"),
            "Distribution of the mismatch severity of every site call that differed (box: quartiles, triangle: mean).",
        )
    ]


def _rq2(study: _Study) -> Section:
    s = Section(
        "rq2",
        "RQ2 - gradient noise of one step",
        "Parameter-sync replays start every step from the golden parameters: the noise-to-signal ratio "
        "||g_s - g_h|| / ||g_h|| measures how wrong one optimizer step's gradient is.",
    )
    by_step = study.query("rq2_noise_by_step")
    if not by_step.rows:
        s.notes.append(
            "No parameter-sync replay is loaded: run `sdc replay --mode param-sync ...` and pass its "
            "log to `sdc diff --replay`."
        )
        return s
    worst = {(r["node_label"], r["pair_id"]): r for r in study.query("rq2_noise_worst").records()}
    fig, ax, drawn = _step_lines(by_step, "ratio")
    for rows, line in drawn:
        w = worst.get((rows[0]["node_label"], rows[0]["pair_id"]))
        if w and w["worst_step"] is not None:
            ax.plot([w["worst_step"]], [w["worst_ratio"]], marker="*", markersize=16, color=line.get_color())
            ax.annotate(
                f"worst {cell(w['worst_ratio'])} (step {w['worst_step']})",
                (w["worst_step"], w["worst_ratio"]),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=8,
            )
    ax.margins(y=0.15)  # room for the worst case's label
    ax.set(
        ylabel="noise-to-signal ||g_s - g_h|| / ||g_h||",
        title="Gradient noise-to-signal per step, per node (star: worst case)",
    )
    s.figures.append((study.save(fig, "rq2_noise.png"), "Noise-to-signal ratio per parameter-sync step and node."))
    s.tables += [("rq2_noise_worst", study.query("rq2_noise_worst"), False), ("rq2_noise_by_step", by_step, True)]
    return s


def _rq3(study: _Study) -> Section:
    s = Section(
        "rq3",
        "RQ3 - what accumulates over training",
        "Without synchronisation the suspect's parameters drift from the healthy node's: drift is "
        "||theta_s - theta_h|| / ||theta_h|| at every checkpoint both runs hold, shown beside both loss "
        "curves; dotted lines mark loss spikes.",
    )
    rows = study.query("rq3_drift_and_loss")
    if not rows.rows:
        s.notes.append("No loss curves are loaded: `sdc diff` a pair of runs.")
        return s
    by_pair: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows.records():
        by_pair[r["pair_id"], r["rank"]].append(r)
    for (pair_id, rank), pr in by_pair.items():
        node = pr[0]["node_label"]
        fig = Figure(figsize=(11, 3.8), layout="constrained")
        loss_ax, drift_ax = fig.subplots(1, 2)
        for side, style in (("golden", "-"), ("suspect", "--")):
            points = [(r["step"], r[f"{side}_loss"]) for r in pr if r[f"{side}_loss"] is not None]
            loss_ax.plot([p[0] for p in points], [p[1] for p in points], style, marker=".", label=f"{side} loss")
        for side, color in (("golden", "grey"), ("suspect", "red")):
            for step in (r["step"] for r in pr if r[f"{side}_spike"]):
                loss_ax.axvline(step, color=color, linestyle=":", linewidth=1.5)
        _step_axis(loss_ax)
        _step_axis(drift_ax)
        loss_ax.set(xlabel="step", ylabel="training loss", title=f"Loss: golden vs {node}")
        loss_ax.legend()
        drift = [(r["step"], r["drift"]) for r in pr if r["drift"] is not None]
        if drift:
            drift_ax.plot([d[0] for d in drift], [d[1] for d in drift], marker="o", color="purple")
        else:
            drift_ax.text(
                0.5, 0.5, "no checkpoint pair: no drift", ha="center", va="center", transform=drift_ax.transAxes
            )
        drift_ax.set(
            xlabel="step (checkpoint: state before the step)",
            ylabel="parameter drift",
            title=f"Parameter drift of {node}",
        )
        name = f"rq3_{_safe(pair_id)}_rank{rank}.png"
        s.figures.append(
            (
                study.save(fig, name),
                f"Pair {pair_id}, rank {rank}: suspect node {node}. "
                "Dotted lines: loss spikes (red: suspect, grey: golden).",
            )
        )
    _drift_rates(study, s, rows)
    spikes = study.query("rq3_loss_spikes")
    if spikes.rows:
        s.tables.append(("rq3_loss_spikes", spikes, False))
    else:
        s.notes.append("Neither run of any pair has a loss spike.")
    s.tables.append(("rq3_drift_and_loss", rows, True))
    return s


def _drift_rates(study: _Study, s: Section, drift_and_loss: Result) -> None:
    """Per golden run: ln drift over steps per node (the baseline dashed) beside the golden's sharpness."""
    rates, sharp = study.query("rq3_drift_rate"), study.query("rq3_sharpness")
    if not any(r["baseline"] for r in rates.records()) and not sharp.rows:
        s.notes.append(
            "No drift baseline and no sharpness: record golden's shuffle-seed twin (data.shuffle_seed=1), "
            "`sdc diff --baseline` it, and record golden with sharpness to plot drift rates."
        )
        return
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in drift_and_loss.records():
        if r["rank"] == 0 and r["drift"]:
            curves[r["pair_id"]].append((r["step"], r["drift"]))
    goldens = sorted({r["golden_run_id"] for r in rates.records()} | {r["run_id"] for r in sharp.records()})
    for golden in goldens:
        fig = Figure(figsize=(11, 4), layout="constrained")
        drift_ax, sharp_ax = fig.subplots(1, 2)
        for r in (r for r in rates.records() if r["golden_run_id"] == golden):
            points = curves.get(r["pair_id"], [])
            rate = f", rate {r['drift_rate']:.3g}/step" if r["drift_rate"] is not None else ""
            style = {"linestyle": "--", "color": "black"} if r["baseline"] else {"marker": "."}
            drift_ax.semilogy([p[0] for p in points], [p[1] for p in points], label=f"{r['node_label']}{rate}", **style)
        _step_axis(drift_ax)
        drift_ax.set(
            xlabel="step (checkpoint)",
            ylabel="parameter drift (log scale)",
            title="Drift per node; dashed: shuffle-seed baseline",
        )
        drift_ax.legend(fontsize=7)
        mine = [r for r in sharp.records() if r["run_id"] == golden]
        if mine:
            sharp_ax.plot([r["step"] for r in mine], [r["sharpness"] for r in mine], marker="o", color="darkgreen")
        else:
            sharp_ax.text(
                0.5, 0.5, "golden recorded without sharpness", ha="center", va="center", transform=sharp_ax.transAxes
            )
        _step_axis(sharp_ax)
        sharp_ax.set(xlabel="step (checkpoint)", ylabel="top Hessian eigenvalue", title="Golden's sharpness")
        s.figures.append(
            (
                study.save(fig, f"rq3_drift_rates_{_safe(golden)}.png"),
                f"Golden run {golden[:12]}: log drift over steps (slope = drift rate, docs/drift.md) "
                "beside the golden's sharpness at the same checkpoints.",
            )
        )
    s.tables += [(name, study.query(name), False) for name in ("rq3_drift_rate", "rq3_drift_spread")]
    if sharp.rows:
        s.tables.append(("rq3_sharpness", sharp, True))


def _finetune(study: _Study) -> Section:
    s = Section(
        "finetune",
        "RQ3 - fine-tuned accuracy and prediction disagreement",
        "Models fine-tuned from the golden, twin and suspect checkpoints: accuracy per task, and how often "
        "the suspect's predictions disagree with the golden model's, against the disagreement of a "
        "healthy twin fine-tuned with another shuffle seed (the baseline).",
    )
    missing = [q for q in FINETUNE_QUERIES if q not in study.library.names()]
    present = {
        t
        for (t,) in study.select(
            "SELECT table_name FROM duckdb_tables() WHERE table_name IN ('finetune_eval', 'finetune_predictions')"
        ).rows
    }
    if missing or present != set(FINETUNE_TABLES):
        s.notes.append(
            "No fine-tuning results in this database (tables finetune_eval and finetune_predictions, "
            "queries rq3_finetune_*)."
        )
        return s
    accuracy, disagreement = (study.query(q) for q in FINETUNE_QUERIES)
    if not accuracy.rows and not disagreement.rows:
        s.notes.append("The fine-tuning tables hold no rows yet.")
        return s
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    acc_ax, dis_ax = fig.subplots(1, 2)
    # One colour per node in both panels, so a node's accuracy and disagreement read together.
    labels = sorted({r["node_label"] for r in accuracy.records()} | {r["suspect_node"] for r in disagreement.records()})
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    _accuracy_bars(acc_ax, accuracy, colors)
    _disagreement_bars(dis_ax, disagreement, colors)
    s.figures.append(
        (
            study.save(fig, "rq3_finetune.png"),
            "Left: accuracy at each run's last evaluated step (hatched: collapsed; black bars: chance). "
            "Right: disagreement with the golden model's predictions, per suspect node and the "
            "shuffle-seed baseline.",
        )
    )
    s.tables += [("rq3_finetune_accuracy", accuracy, True), ("rq3_finetune_disagreement", disagreement, False)]
    return s


def _guard(study: _Study) -> Section:
    s = Section(
        "guard",
        "The guard - detectors scored against the injected faults",
        "Each detector of the guard (docs/guard.md), and the guard's default combination ('guard'), run over "
        "every step of each suspect and scored against the fault events: recall over all faulty steps and "
        "over harmful ones (param-sync noise-to-signal above 0.01 or a loss 10 % off golden's), precision, "
        "and false alarms per 100 steps (on the healthy twin, its false-alarm rate). A node recorded "
        "again under the guard is set beside its unguarded recording: steps flagged and recomputed, the "
        "step-time overhead, loss spikes, final drift and fine-tuned accuracy.",
    )
    tables = {
        t
        for (t,) in study.select(
            "SELECT table_name FROM duckdb_tables() WHERE table_name IN ('detector_alarms', 'guard_decisions')"
        ).rows
    }
    if any(q not in study.library.names() for q in GUARD_QUERIES) or tables != {"detector_alarms", "guard_decisions"}:
        s.notes.append(
            "This database predates the detector tables (detector_alarms, guard_decisions): diff the "
            "runs again into a new --db."
        )
        return s
    scores, outcome = (study.query(q) for q in GUARD_QUERIES)
    if scores.rows:
        s.tables.append(("guard_detector_scores", scores, False))
    else:
        s.notes.append("No pretraining pair is loaded: `sdc diff` a suspect against its golden run.")
    if outcome.rows:
        s.tables.append(("guard_outcome", outcome, False))
    else:
        s.notes.append(
            "No guarded recording beside an unguarded one: record a node again with `sdc record "
            "--guard POLICY` as <node>-guarded (a study does it for a node with guard = POLICY)."
        )
    return s


def _accuracy_bars(ax: Axes, accuracy: Result, colors: dict[str, str]) -> None:
    last: dict[tuple[str, str, str, str], dict] = {}
    for r in accuracy.records():  # the query orders by step: the last row of a run and task wins
        key = (r["node_label"], r["role"], r["run_id"], r["task"])
        if key not in last or r["step"] >= last[key]["step"]:
            last[key] = r
    tasks = sorted({k[3] for k in last})
    runs = sorted({k[:3] for k in last})
    if not tasks:
        ax.text(0.5, 0.5, "no accuracy rows", ha="center", va="center", transform=ax.transAxes)
        return
    width = 0.8 / len(runs)
    for j, run in enumerate(runs):
        xs, ys, hatches = [], [], []
        for i, task in enumerate(tasks):
            r = last.get((*run, task))
            if r is not None and r["accuracy"] is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(r["accuracy"])
                hatches.append("//" if r["collapsed"] else "")
        bars = ax.bar(xs, ys, width, label=f"{run[0]} ({run[1]})", color=colors.get(run[0]))
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
    for i, task in enumerate(tasks):
        chance = [r["chance"] for k, r in last.items() if k[3] == task and r["chance"] is not None]
        if chance:
            ax.hlines(max(chance), i - 0.45, i + 0.45, colors="black", linewidth=2)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set(ylabel="accuracy", title="Fine-tuned accuracy per task and node", ylim=(0, 1.25))
    ax.legend(fontsize=8, loc="upper center", ncols=3)  # above the bars: accuracy is at most 1


def _disagreement_bars(ax: Axes, disagreement: Result, colors: dict[str, str]) -> None:
    rows = disagreement.records()
    tasks = sorted({r["task"] for r in rows})
    nodes = sorted({r["suspect_node"] for r in rows})
    if not tasks:
        ax.text(0.5, 0.5, "no disagreement rows", ha="center", va="center", transform=ax.transAxes)
        return
    series = [*nodes, "baseline (shuffle seed)"]
    width = 0.8 / len(series)
    for j, name in enumerate(series):
        xs, ys = [], []
        for i, task in enumerate(tasks):
            if j < len(nodes):
                values = [r["disagreement"] for r in rows if r["task"] == task and r["suspect_node"] == name]
            else:
                values = [r["baseline_disagreement"] for r in rows if r["task"] == task]
            values = [v for v in values if v is not None]
            if values:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(sum(values) / len(values))
        ax.bar(xs, ys, width, label=name, color="lightgrey" if j == len(nodes) else colors.get(name), edgecolor="black")
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set(ylabel="share of predictions that differ from golden", title="Prediction disagreement vs baseline")
    ax.legend(fontsize=8)


# -- helpers ------------------------------------------------------------------------------
def _step_lines(result: Result, column: str) -> tuple[Figure, Axes, list[tuple[list[dict], Line2D]]]:
    """``column`` over steps, one line per node: the figure, its axes, and each line with its rows."""
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    drawn = []
    for label, rows in _series(result).items():
        (line,) = ax.plot([r["step"] for r in rows], [r[column] for r in rows], marker="o", label=label)
        drawn.append((rows, line))
    _step_axis(ax)
    ax.set(xlabel="step")
    ax.legend(title="suspect node")
    return fig, ax, drawn


def _series(result: Result) -> dict[str, list[dict]]:
    """Rows grouped by (node, pair) in query order; a node in several pairs gets its pair's id in the label."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in result.records():
        groups[str(r["node_label"]), r["pair_id"]].append(r)
    pairs_per_node: dict[str, int] = defaultdict(int)
    for node, _ in groups:
        pairs_per_node[node] += 1
    return {
        (node if pairs_per_node[node] == 1 else f"{node} ({pair[:8]})"): rows for (node, pair), rows in groups.items()
    }


def _step_axis(ax: Axes) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64]


# -- the page --------------------------------------------------------------------------------
_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption, .query { color: #555; font-size: .9em; }
.note { background: #fff8e0; border-left: 4px solid #e0b000; padding: .4em .8em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1.5em; }
th, td { border: 1px solid #ddd; padding: .2em .5em; } th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
nav a { margin-right: 1em; }
"""


def _page(db: Path, sections: list[Section], library: QueryLibrary) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>sdctrace study report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>sdctrace study report</h1>",
        f"<p>Study database <code>{e(db.name)}</code> beside this folder. "
        "Every table and plot is a named query: <code>sdc query NAME --db FILE</code> prints it in full.</p>",
        "<nav>" + "".join(f'<a href="#{s.key}">{e(s.title)}</a>' for s in sections) + "</nav>",
    ]
    for s in sections:
        parts += [f'<section id="{s.key}"><h2>{e(s.title)}</h2>', f"<p>{e(s.intro)}</p>"]
        parts += [f'<p class="note">{e(note)}</p>' for note in s.notes]
        for name, caption in s.figures:
            parts.append(
                f'<figure><img src="{e(name)}" alt="{e(caption)}"><figcaption>{e(caption)}</figcaption></figure>'
            )
        for name, result, folded in s.tables:
            parts.append(_table_html(name, library.description(name), result, folded))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _table_html(name: str, description: str, result: Result, folded: bool) -> str:
    e = html.escape
    shown = result.rows[:HTML_ROWS]

    def td(v: object) -> str:
        number = isinstance(v, int | float) and not isinstance(v, bool)
        return f'<td class="num">{e(cell(v))}</td>' if number else f"<td>{e(cell(v))}</td>"

    head = "".join(f"<th>{e(c)}</th>" for c in result.columns)
    body = "".join("<tr>" + "".join(td(v) for v in row) + "</tr>" for row in shown) or (
        f'<tr><td colspan="{len(result.columns)}">no rows</td></tr>'
    )
    more = (
        f'<p class="query">{len(shown)} of {len(result.rows)} rows shown.</p>' if len(result.rows) > len(shown) else ""
    )
    title = f'{e(description)} <span class="query">(<code>sdc query {e(name)}</code>)</span>'
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"
    return f"<details><summary>{title}</summary>{table}</details>" if folded else f"<h3>{title}</h3>{table}"
