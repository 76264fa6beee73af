"""Recording, verify-determinism and diff on xla:0: one graph per traced step, bit-identical runs."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tests.xla.conftest import SKIP_REASON, samples, xla_metrics

pytest.importorskip("torch_xla", reason=SKIP_REASON)

from jobs.record import record_run  # noqa: E402
from sdc.cli import main  # noqa: E402
from tests.sdc.test_cli import SMALL_ARGS  # noqa: E402
from tests.support import events, small_config  # noqa: E402
from tracer.blobs import BlobStore  # noqa: E402
from tracer.fingerprint import fingerprint  # noqa: E402
from tracer.log import LogReader, Phase, TensorRecord, rank_dir  # noqa: E402

STEPS = 4  # checkpoints before steps 0 and 2 (SMALL); steps 1 and 3 are plain steps
CAPTURED = r"layers\.1\.attention"


@pytest.fixture(scope="module")
def xla_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[tuple[int, int, int]]]:
    """Two XLA runs of one config, the first with torch_xla's counters read after every step,
    the second keeping full tensors of one site at the last step."""
    met = xla_metrics()
    root = tmp_path_factory.mktemp("xla")
    per_step: list[tuple[int, int, int]] = []  # (step, graphs run, host reads) during that step

    def count(step: int, loss: float) -> None:
        now = samples(met, "ExecuteTime"), samples(met, "TransferFromDeviceTime")
        per_step.append((step, now[0] - last[0], now[1] - last[1]))
        last[:] = now

    met.clear_counters()
    last = [samples(met, "ExecuteTime"), samples(met, "TransferFromDeviceTime")]
    cfg = small_config(f"run.steps={STEPS}")
    record_run(cfg, root / "a", node_label="xla-a", progress=False, device="xla", on_step=count)
    args = ["record", "--device", "xla", "--out", str(root / "b"), "--node-label", "xla-b", "--quiet", *SMALL_ARGS]
    capture = ["--capture-steps", str(STEPS - 1), "--capture-names", CAPTURED]
    assert main([*args, "--steps", str(STEPS), *capture]) == 0
    return root / "a", root / "b", per_step


def tensors(run: Path) -> list[TensorRecord]:
    return [r for r in LogReader(rank_dir(run, 0)).records() if isinstance(r, TensorRecord)]


def test_the_header_names_the_xla_device_and_its_software(xla_runs) -> None:
    header = LogReader(rank_dir(xla_runs[0], 0)).header
    assert header.device == "xla:0"
    assert header.versions["torch_xla"] and header.versions["torch"].startswith("2.9")
    assert header.determinism["pjrt_device"] == "CPU" and "xla_flags" in header.determinism
    assert [e.step for e in events(xla_runs[0], "step")] == list(range(STEPS))


def test_each_traced_step_runs_one_graph_and_reads_the_host_twice(xla_runs) -> None:
    met = xla_metrics()
    plain = [(graphs, reads) for step, graphs, reads in xla_runs[2] if step % 2 == 1]
    # One graph: forward, backward, optimizer and every digest. Two reads: the Tracer's
    # digests and losses in one batch, and the losses train_step returns.
    assert plain == [(1, 2)] * (STEPS // 2)
    assert all(graphs == 1 for _, graphs, _ in xla_runs[2])  # checkpoints read, but run nothing
    assert not met.executed_fallback_ops(), "an op ran on the host instead of in the graph"


def test_every_site_gradient_and_parameter_is_recorded_in_eager_order(xla_runs, tmp_path: Path) -> None:
    cpu = tmp_path / "cpu"
    record_run(small_config(f"run.steps={STEPS}"), cpu, node_label="cpu", progress=False)
    on_xla, on_cpu = tensors(xla_runs[0]), tensors(cpu)
    key = [(r.step, r.microbatch, r.name, r.phase, r.meta) for r in on_xla]
    assert key == [(r.step, r.microbatch, r.name, r.phase, r.meta) for r in on_cpu]
    # The same token batches, fingerprinted on xla:0 and on the CPU, give the same bits.
    inputs = [(r.step, r.microbatch, r.fingerprint) for r in on_xla if r.phase == Phase.INPUT]
    assert inputs == [(r.step, r.microbatch, r.fingerprint) for r in on_cpu if r.phase == Phase.INPUT]
    assert [e.fields["loss"] for e in events(xla_runs[0], "loss")] == pytest.approx(
        [e.fields["loss"] for e in events(cpu, "loss")], rel=1e-3
    )
    # The norm before clipping, read in the step's one transfer (the reference config clips at 1.0).
    norms = [e.fields["grad_norm"] for e in events(xla_runs[0], "step")]
    assert len(norms) == STEPS
    assert norms == pytest.approx([e.fields["grad_norm"] for e in events(cpu, "step")], rel=1e-3)


def test_two_xla_runs_diff_to_zero_differences(xla_runs, tmp_path: Path) -> None:
    db = tmp_path / "study.duckdb"
    a, b, _ = xla_runs
    assert main(["diff", "--golden", str(a), "--suspect", str(b), "--db", str(db)]) == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        ((n, differing),) = con.execute("SELECT count(*), count(*) FILTER (NOT equal) FROM event_diffs").fetchall()
        first = con.execute("SELECT count(*) FROM first_divergence").fetchall()
    finally:
        con.close()
    assert n == len(tensors(a)) and differing == 0 and first == [(0,)]


def test_captured_tensors_are_the_recorded_bits(xla_runs) -> None:
    run = xla_runs[1]
    blobs = events(run, "blob")
    assert {(e.step, e.fields["name"]) for e in blobs} == {(STEPS - 1, "layers.1.attention")}
    assert len(blobs) == 2 * 2  # forward output and input gradient, per microbatch
    store = BlobStore(run)
    for e in blobs:
        assert fingerprint(store.get(e.fields["fingerprint"])) == e.fields["fingerprint"]


def test_verify_determinism_on_xla(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify-determinism", "--device", "xla", "--steps", "2", "--quiet", *SMALL_ARGS]) == 0
    assert capsys.readouterr().out.startswith("bit-identical:")


def test_fault_emulation_on_xla_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["record", "--device", "xla", "--out", str(tmp_path / "f"), "--abft", "--quiet"]
    assert main(args) != 0
    assert capsys.readouterr().err.startswith("sdc: error: --device xla: the fault emulator and ABFT")


def test_replaying_an_xla_run_is_refused_in_one_line(xla_runs, tmp_path: Path, capsys) -> None:
    golden, suspect, _ = xla_runs
    args = [
        "replay",
        "--golden",
        str(golden),
        "--suspect",
        str(suspect),
        "--steps",
        "1:2",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main([*args, "--quiet"]) != 0
    assert "recorded on xla:0; replay re-executes on the CPU" in capsys.readouterr().err
