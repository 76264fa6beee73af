"""Run a whole study: record, replay, diff, fine-tune, report, in one resumable job.

    result = run_study(load_study("demo"), Path("demo"))

Layout of the output directory:

    runs/<label>/                    pretraining run of each node (golden first; <label>-guarded: under the guard)
    replays/<label>-<mode>/          replay of the study's window on each node
    finetune/<label>/                fine-tune of each node's final model (+ <golden>-twin, -twin-2 ...)
    study.duckdb                     every pair diffed into one database
    report/index.html                plots and summary tables
    study.log                        the full output of every job
    study-state.json                 which jobs finished, for --resume

Run ids are derived from the study (its file, overrides and name) and each run's node and
role (`derived_run_id`), not drawn at random, so two runs of a study record the same
headers, diff into the same pair ids and give the same report bytes.

Every job writes into its own directory, and the state file is rewritten after each
job finishes, so a crash or Ctrl-C loses only the job that was running: `--resume`
skips what finished and redoes the rest, refusing if the study file changed since.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from faults import load_profile
from jobs.record import record_run
from jobs.replay import golden_header, replay
from pipelines.arguments import DiffRequest
from pipelines.diff_job import diff_job
from replay.request import ReplayRequest, suspect_from_run
from sdc.study.folders import DB, LOG, REPORT, STATE, STUDY_FOLDER, refuse_foreign_databases
from sdc.study.study_file import Finetune, Study
from tracer.bounded_read import Bounds, read_json
from tracer.errors import UsageError
from tracer.log.claim import FolderKind, claim_folder, reclaim_folder
from tracer.log.runlock import RunLock

# Printed at the end of a study, in this order (named queries in analysis/queries).
SUMMARY_QUERIES = (
    "summary",
    "rq1_mismatch_by_node",
    "rq1_mismatch_bursts",
    "rq1_abft_by_fault_kind",
    "rq2_noise_worst",
    "rq3_finetune_accuracy",
    "rq3_finetune_disagreement",
    "guard_detector_scores",
    "guard_outcome",
)


@dataclass(frozen=True)
class StudyPaths:
    """Where each job of a study writes; the runs of the ``shared`` labels are read from ``borrowed``'s folder
    instead (a fleet study's second fault model diffs its nodes against the first one's golden runs)."""

    out: Path
    borrowed: StudyPaths | None = None
    shared: frozenset[str] = frozenset()

    def _owner(self, label: str) -> Path:
        return self.borrowed._owner(label) if self.borrowed is not None and label in self.shared else self.out

    def run(self, label: str) -> Path:
        return self._owner(label) / "runs" / label

    def replay(self, label: str, mode: str) -> Path:
        return self._owner(label) / "replays" / f"{label}-{mode}"

    def finetune(self, label: str) -> Path:
        return self._owner(label) / "finetune" / label

    def writes(self, job: Job) -> bool:
        """Whether `job` writes into this folder: not one that records, replays or fine-tunes a borrowed run."""
        kind, _, rest = job.name.partition(":")
        return not (
            kind in ("record", "replay", "finetune") and rest.split(":")[0] in self.shared and self.borrowed is not None
        )

    @property
    def db(self) -> Path:
        return self.out / DB

    @property
    def report(self) -> Path:
        return self.out / REPORT


@dataclass(frozen=True)
class Job:
    name: str  # unique within the study; the key in the state file
    describe: str
    action: Callable[[], str]  # does the work, returns a one-line result


@dataclass
class StudyResult:
    paths: StudyPaths
    wall_s: float = 0.0


def study_fingerprint(study: Study) -> str:
    """What a resumed study must share with the one that started: its file and overrides."""
    return file_fingerprint(study.source, study.config_overrides)


def derived_run_id(study: Study, label: str, role: str) -> str:
    """The run id of node `label`'s `role` run ("train", "finetune", "replay-lockstep", ...) in `study`: a hash of the
    study's file, overrides and name (a fleet study's part: "fleet/rq1") and of the node and role, as long as a random
    id."""
    key = json.dumps([study_fingerprint(study), study.name, label, role])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def file_fingerprint(source: Path, overrides: tuple[str, ...]) -> str:
    h = hashlib.sha256(source.read_bytes())
    h.update(json.dumps(list(overrides)).encode())
    return h.hexdigest()


def run_study(
    study: Study,
    out: Path,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    beam_args: tuple[str, ...] = (),
) -> StudyResult:
    """Run every job of `study` into `out`; see the module docstring for the layout."""
    paths = StudyPaths(Path(out))
    state = StudyState(paths.out, study.name, study_fingerprint(study), STUDY_FOLDER)
    lock, finished = state.claim(overwrite=overwrite, resume=resume)
    with lock:
        jobs = plan_jobs(study, paths, progress=progress, beam_args=beam_args)
        return StudyResult(paths, run_jobs(jobs, state, finished, progress=progress))


def run_jobs(jobs: list[Job], state: StudyState, finished: list[str], *, progress: bool) -> float:
    """Run `jobs` in order, skipping those in `finished`, saving the state after each; returns the wall time."""
    start = time.perf_counter()
    bar = tqdm(
        jobs, desc=f"study {state.name}", unit="job", disable=None if progress else True, position=0, leave=False
    )
    with open(state.out / LOG, "a", encoding="utf-8") as log:
        for i, job in enumerate(bar, 1):
            prefix = f"[{i:>2}/{len(jobs)}] {job.describe}"
            if job.name in finished:
                bar.write(f"{prefix}: done before, skipped (--resume)")
                continue
            bar.set_postfix_str(job.describe)
            t0, c0 = time.perf_counter(), _cpu_seconds()
            log.write(f"\n== {job.describe} ==\n")
            log.flush()
            # The terminal gets one line per job; what a job says (the sites it traces, warnings) goes to the log.
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                line = job.action()
            cpu = _cpu_seconds() - c0
            bar.write(f"{prefix}: {line} ({time.perf_counter() - t0:.1f} s, {cpu:.1f} s CPU)")
            finished.append(job.name)
            state.save(finished)
    return time.perf_counter() - start


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads) and its waited-for children: a job's cost on a
    loaded machine, where wall seconds say little."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def plan_jobs(study: Study, paths: StudyPaths, *, progress: bool, beam_args: tuple[str, ...]) -> list[Job]:
    """Every job of the study, in the order they must run."""
    golden = study.golden
    jobs = [
        Job(
            f"record:{golden}",
            f"record {golden} (healthy)",
            lambda: record_node(
                study, paths.run(golden), golden, None, 0, study.abft_golden, progress, sharpness=study.sharpness
            ),
        )
    ]
    for n in study.nodes:
        jobs.append(
            Job(
                f"record:{n.label}",
                f"record {n.label} ({n.profile}{', ABFT' if n.abft else ''})",
                lambda n=n: record_node(study, paths.run(n.label), n.label, n.profile, n.fault_seed, n.abft, progress),
            )
        )
    for n in study.nodes:
        if n.guarded is not None:
            jobs.append(
                Job(
                    f"record:{n.guarded}",
                    f"record {n.guarded} ({n.profile}, guard {n.guard})",
                    lambda n=n: record_node(
                        study, paths.run(n.guarded), n.guarded, n.profile, n.fault_seed, n.abft, progress, guard=n.guard
                    ),
                )
            )
    steps = study.replay.steps
    for n in study.nodes:
        for mode in study.replay.modes:
            jobs.append(
                Job(
                    f"replay:{n.label}:{mode}",
                    f"replay {n.label} {mode} {steps.start}:{steps.stop}",
                    lambda n=n, mode=mode: _replay(study, paths, golden, n.label, mode, steps, progress),
                )
            )
    for n in study.nodes:
        replays = [paths.replay(n.label, m) for m in study.replay.modes]
        jobs.append(
            Job(
                f"diff:{n.label}",
                f"diff {golden} vs {n.label}",
                lambda n=n, replays=replays: diff_into_db(
                    paths.run(golden), paths.run(n.label), replays, paths.db, beam_args
                ),
            )
        )
        if n.guarded is not None:  # no replays: the guarded run is compared as it trained
            jobs.append(
                Job(
                    f"diff:{n.guarded}",
                    f"diff {golden} vs {n.guarded}",
                    lambda n=n: diff_into_db(paths.run(golden), paths.run(n.guarded), [], paths.db, beam_args),
                )
            )
    if study.finetune is not None:
        jobs += _finetune_jobs(study, paths, progress=progress, beam_args=beam_args)
    jobs.append(Job("report", "report", lambda: _report(paths, progress)))
    return jobs


def _finetune_jobs(study: Study, paths: StudyPaths, *, progress: bool, beam_args: tuple[str, ...]) -> list[Job]:
    """RQ3b: fine-tune golden, its shuffle-seed twins and every node, then diff each against golden (a twin as a
    baseline pair)."""
    ft, golden = study.finetune, study.golden
    assert ft is not None
    twins = ft.twin_labels(golden)
    runs = [(golden, golden, None, 0, None), *((label, golden, None, 0, seed) for label, seed in twins)]
    runs += [(n.label, n.label, n.profile, n.fault_seed, None) for n in study.nodes]
    runs += [(n.guarded, n.guarded, n.profile, n.fault_seed, None) for n in study.nodes if n.guarded is not None]
    jobs = []
    for label, source, profile, seed, shuffle in runs:
        detail = profile or (f"shuffle seed {shuffle}" if shuffle is not None else "")
        describe = f"fine-tune {label} ({detail + ', ' if detail else ''}{ft.settings.steps} steps)"
        jobs.append(
            Job(
                f"finetune:{label}",
                describe,
                lambda label=label, source=source, profile=profile, seed=seed, shuffle=shuffle: _finetune(
                    ft,
                    paths.run(source),
                    paths.finetune(label),
                    label,
                    profile,
                    seed,
                    shuffle,
                    progress,
                    derived_run_id(study, label, "finetune"),
                ),
            )
        )
    # A twin cannot be a pair's suspect (it differs from golden in its data order), so each pair takes one twin as
    # its baseline, in turn: with n twins, node k's pair gets twin k mod n, and every twin is in some pair when there
    # are at least n nodes (the twins' rows in rq3_finetune_accuracy and rq3_finetune_disagreement)
    suspects = [n.label for n in study.nodes] + [n.guarded for n in study.nodes if n.guarded is not None]
    for k, label in enumerate(suspects):
        twin = twins[k % len(twins)][0]
        jobs.append(
            Job(
                f"diff-finetune:{label}",
                f"diff fine-tuned {golden} vs {label} (twin baseline {twin})",
                lambda label=label, twin=twin: diff_into_db(
                    paths.finetune(golden), paths.finetune(label), [], paths.db, beam_args, twin=paths.finetune(twin)
                ),
            )
        )
    # Every twin is also diffed against golden as a baseline pair: healthy pairs whose loss spikes are the null of
    # the spike finding (rq3_loss_spikes, kind baseline)
    for label, _ in twins:
        jobs.append(
            Job(
                f"diff-finetune:{label}",
                f"diff fine-tuned {golden} vs {label} (a healthy twin: the spikes' null)",
                lambda label=label: diff_into_db(
                    paths.finetune(golden), paths.finetune(label), [], paths.db, beam_args, baseline=True
                ),
            )
        )
    return jobs


def _finetune(
    ft: Finetune,
    pretrained: Path,
    out: Path,
    label: str,
    profile: str | None,
    seed: int,
    shuffle: int | None,
    progress: bool,
    run_id: str,
) -> str:
    from jobs.finetune import finetune_run

    settings = ft.settings if shuffle is None else dataclasses.replace(ft.settings, shuffle_seed=shuffle)
    summary = finetune_run(
        pretrained,
        out,
        node_label=label,
        settings=settings,
        fault_profile=load_profile(profile) if profile else None,
        fault_seed=seed,
        overwrite=True,
        progress=progress,
        run_id=run_id,
    )
    accuracy = ", ".join(f"{e.task} {e.accuracy:.0%}" for e in summary.final)
    return f"{summary.steps} steps; test accuracy {accuracy}"


def summary_tables(db: Path) -> list[tuple[str, str]]:
    """(title, table text) of the queries a reader looks at first, those with rows."""
    from analysis.formats import table
    from analysis.queries import LIBRARY

    out = []
    for name in SUMMARY_QUERIES:
        if name in LIBRARY.names():
            result = LIBRARY.run(db, name)
            if result.rows:
                out.append((f"{name}: {LIBRARY.description(name)}", table(result)))
    return out


def record_node(
    study: Study,
    out: Path,
    label: str,
    profile: str | None,
    seed: int,
    abft: bool,
    progress: bool,
    guard: str | None = None,
    sharpness: int = 0,
) -> str:
    """Record one node of ``study`` into ``out`` (replacing a run there); the job's one-line result."""
    summary = record_run(
        study.train,
        out,
        node_label=label,
        overwrite=True,
        progress=progress,
        fault_profile=load_profile(profile) if profile else None,
        fault_seed=seed,
        abft=abft,
        guard=guard,
        sharpness=sharpness,
        run_id=derived_run_id(study, label, "train"),
    )
    return f"{summary.steps} steps, final loss {summary.final_loss:.4f}"


def _replay(study: Study, paths: StudyPaths, golden: str, label: str, mode: str, steps: range, progress: bool) -> str:
    header = golden_header(paths.run(golden))
    suspect = suspect_from_run(paths.run(label), header, paths.run(golden))
    summaries = replay(
        ReplayRequest(
            golden=paths.run(golden),
            out=paths.replay(label, mode),
            steps=steps,
            suspect=suspect,
            mode=mode,
            overwrite=True,
            progress=progress,
            run_id=derived_run_id(study, label, f"replay-{mode}"),
        ),
        header,
    )
    results = [r for summary in summaries for r in summary.steps]
    if mode == "lockstep":
        worst = max((r.worst_frequency for r in results), default=0.0)
        return f"worst site mismatch frequency {worst:.3g}"
    worst = max((r.noise for r in results), default=0.0)
    return f"worst noise-to-signal {worst:.3g}"


def diff_into_db(
    golden: Path,
    suspect: Path,
    replays: list[Path],
    db: Path,
    beam_args: tuple[str, ...],
    twin: Path | None = None,
    baseline: bool = False,
) -> str:
    """Diff ``suspect`` against ``golden`` (with its replays, a twin baseline) into ``db``; the one-line result."""

    request = DiffRequest(
        golden=str(golden),
        suspect=str(suspect),
        db=db,
        replays=tuple(map(str, replays)),
        twin=str(twin) if twin is not None else None,
        beam_args=beam_args,
        baseline=baseline,
    )
    report = diff_job()(request)
    return f"{report.rows.get('event_diffs', 0):,} events compared into {db.name}"


def _report(paths: StudyPaths, progress: bool) -> str:
    from analysis.study_report import build_report

    report = build_report(paths.db, paths.report, progress=progress)
    return f"{len(report.images)} plot(s) in {report.index}"


@dataclass(frozen=True)
class StudyState:
    """The output directory's state file: which study wrote it and which of its jobs finished."""

    out: Path
    name: str
    fingerprint: str  # of what a resumed study must share with the one that started
    kind: FolderKind  # which names in the folder are the study's: --overwrite deletes those, and refuses any other

    def claim(self, *, overwrite: bool, resume: bool) -> tuple[RunLock, list[str]]:
        """Claim the output directory (`claim_folder`) and lock it; return the lock (held while the study runs)
        and the jobs a resumed study has finished."""
        if not resume:
            lock = claim_folder(
                self.out, self.kind, overwrite=overwrite, check=lambda: refuse_foreign_databases(self.out)
            )
            try:
                self.save([])
            except BaseException:
                lock.release()
                raise
            return lock, []
        lock = reclaim_folder(self.out, self.kind, missing="run without --resume")
        try:
            state = read_state(self.out / STATE)
            if state.fingerprint != self.fingerprint:
                raise UsageError(
                    f"{self.out}: was started from a different study file or overrides; run with "
                    "--overwrite to start again, or resume with the same study"
                )
        except BaseException:
            lock.release()
            raise
        return lock, list(state.finished)

    def save(self, finished: list[str]) -> None:
        tmp = self.out / (STATE + ".tmp")
        tmp.write_text(
            json.dumps({"study": self.fingerprint, "name": self.name, "finished": finished}, indent=1), encoding="utf-8"
        )
        os.replace(tmp, self.out / STATE)


@dataclass(frozen=True)
class SavedState:
    """A state file, read back: the fingerprint of the study that wrote it and the jobs that finished."""

    fingerprint: str
    finished: tuple[str, ...]


def read_state(path: Path) -> SavedState:
    """Parse a study's state file; a `UsageError` naming the file and the fix if it is missing or broken."""
    fix = "run with --overwrite to start the study again"
    if not path.is_file():
        raise UsageError(f"{path.parent}: holds no {STATE}, so there is nothing to resume; run without --resume")
    state = read_json(path, "study state file", Bounds(file_bytes=64 << 20, depth=8), fix, UsageError)
    if not isinstance(state, dict):
        raise UsageError(f"{path}: is not a study state file (a JSON {type(state).__name__}, not an object); {fix}")
    fingerprint, finished = state.get("study"), state.get("finished", [])
    if not isinstance(fingerprint, str):
        raise UsageError(f"{path}: field 'study' is missing or not a string; {fix}")
    if not isinstance(finished, list) or not all(isinstance(j, str) for j in finished):
        raise UsageError(f"{path}: field 'finished' is not a list of job names; {fix}")
    return SavedState(fingerprint, tuple(finished))
