"""Inside a step, a Tracer writing its own log digests each CPU tensor at once but builds its record later, and
holds its loss events with them (tracing.py, `Tracer.record`). What reaches the log must not change: the same
records in the same order as a sink sees them (a sink is never held), nothing lost when the step fails, memory
bounded in a long step, and a bad step or microbatch index refused where the loop gives it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tracer.test_tracing import MIXER, Mixer
from tracer.errors import UsageError
from tracer.guard.runtime import Held
from tracer.log import LogReader, rank_dir
from tracer.log.records import EventRecord, Phase, TensorRecord
from tracer.options import RunInfo
from tracer.tracing import Tracer


def _train(**where: object) -> list[TensorRecord | EventRecord]:
    torch.manual_seed(0)
    model = Mixer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(model, opt, run=RunInfo("x"), options=MIXER, **where) as tr:  # type: ignore[arg-type]  # out= or sink=
        tr.event("before", at_step=0)
        for step in range(3):
            with tr.step(step):
                for mb in range(2):
                    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(10 * step + mb))
                    tr.microbatch(mb, inputs=x)
                    loss = model(x).pow(2).mean() / 2
                    loss.backward()
                    tr.event("between", microbatch=mb)  # an event amid held records keeps its place
                    tr.loss(loss)
                opt.step()
                opt.zero_grad()
    if "sink" in where:
        return where["sink"].records  # type: ignore[attr-defined]  # a Held sink
    return [r for r in LogReader(rank_dir(where["out"], 0)).records() if isinstance(r, (TensorRecord, EventRecord))]


def _comparable(r: TensorRecord | EventRecord) -> object:
    if isinstance(r, EventRecord) and r.kind == "step":
        return r.kind, r.step, r.fields["loss"]  # wall_s differs
    if isinstance(r, TensorRecord):  # the log stores L2 and absmax as float32
        return r.step, r.microbatch, r.name, r.phase, r.fingerprint, r.nan, r.inf, r.meta
    return r


def test_the_log_holds_what_a_sink_sees_in_the_same_order(tmp_path: Path) -> None:
    # A run directory's log also holds the RNG at each step's start (tracer/rng.py), which a sink does not get.
    logged = [r for r in _train(out=tmp_path / "run") if not (isinstance(r, EventRecord) and r.kind == "rng")]
    seen = _train(sink=Held())  # a sink that keeps every record in order
    assert [_comparable(r) for r in logged] == [_comparable(r) for r in seen]
    phases = {r.phase for r in logged if isinstance(r, TensorRecord)}
    assert {Phase.INPUT, Phase.FORWARD, Phase.BACKWARD, Phase.GRAD, Phase.PARAM} <= phases


def test_a_failing_step_keeps_what_it_recorded_before_the_failure(tmp_path: Path) -> None:
    model = Mixer()
    tracer = Tracer(model, None, out=tmp_path / "run", run=RunInfo("x"), options=MIXER)
    with pytest.raises(RuntimeError, match="boom"), tracer as tr, tr.step(0):
        model(torch.randn(2, 16)).sum().backward()
        raise RuntimeError("boom")
    reader = LogReader(rank_dir(tmp_path / "run", 0))
    recs = [r for r in reader.records() if isinstance(r, TensorRecord)]
    assert reader.status.end.status == "failed"
    assert {(r.name, r.phase) for r in recs} == {
        (f"blocks.{i}.{site}", phase)
        for i in range(2)
        for site in ("token_mix", "channel_mix")
        for phase in (Phase.FORWARD, Phase.BACKWARD)
    }


def test_a_step_failing_after_its_update_keeps_its_loss_gradients_and_parameters(tmp_path: Path) -> None:
    model = Mixer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = Tracer(model, opt, out=tmp_path / "run", run=RunInfo("x"), options=MIXER)
    with pytest.raises(RuntimeError, match="boom"), tracer as tr, tr.step(0):
        loss = model(torch.randn(2, 16)).sum()
        loss.backward()
        tr.loss(loss)
        opt.step()
        raise RuntimeError("boom")
    recs = list(LogReader(rank_dir(tmp_path / "run", 0)).records())
    losses = [r.fields["loss"] for r in recs if isinstance(r, EventRecord) and r.kind == "loss"]
    assert losses == [pytest.approx(loss.item())]
    params = {name for name, _ in model.named_parameters()}
    for phase in (Phase.GRAD, Phase.PARAM):
        assert {r.name for r in recs if isinstance(r, TensorRecord) and r.phase == phase} == params


@pytest.mark.parametrize(
    "fields",
    [{"n": 2**70}, {"text": "\ud800"}, {"bad": object()}],
    ids=["int past 64 bits", "lone surrogate", "object"],
)
def test_an_event_the_log_cannot_store_is_refused_where_it_is_logged_inside_a_step(
    tmp_path: Path, fields: dict[str, object]
) -> None:
    model = Mixer()
    with Tracer(model, None, out=tmp_path / "run", run=RunInfo("x"), options=MIXER) as tr, tr.step(0):
        model(torch.randn(2, 16)).sum().backward()
        tr.event("fine", n=1)
        with pytest.raises(UsageError, match="event 'bad' at step 0 cannot be stored"):
            tr.event("bad", **fields)
    recs = list(LogReader(rank_dir(tmp_path / "run", 0)).records())
    assert [r.kind for r in recs if isinstance(r, EventRecord) and r.kind in ("fine", "bad")] == ["fine"]
    assert len([r for r in recs if isinstance(r, TensorRecord)]) == 8  # nothing the step recorded was lost


def test_a_long_step_writes_as_it_goes(tmp_path: Path) -> None:
    model = Mixer()
    with Tracer(model, None, out=tmp_path / "run", run=RunInfo("x"), options=MIXER) as tr:
        with tr.step(0):
            model(torch.randn(2, 16))
        writer = tr.log.writer  # opened at step 0's end
        before = writer.records_written
        with torch.no_grad(), tr.step(1):
            for mb in range(1100):  # four sites: 4 400 forward records
                tr.microbatch(mb)
                model(torch.randn(2, 16))
            assert writer.records_written - before >= 4096
    recs = [r for r in LogReader(rank_dir(tmp_path / "run", 0)).records() if isinstance(r, TensorRecord)]
    assert [(r.microbatch, r.name) for r in recs if r.step == 1] == [
        (mb, f"blocks.{i}.{site}") for mb in range(1100) for i in range(2) for site in ("token_mix", "channel_mix")
    ]


def test_a_numpy_or_torch_integer_index_is_stored_as_an_int(tmp_path: Path) -> None:
    model = Mixer()
    with Tracer(model, None, out=tmp_path / "run", run=RunInfo("x"), options=MIXER) as tr:
        for step in np.arange(2, 4):
            with tr.step(step):
                tr.microbatch(torch.tensor(1))
                model(torch.randn(2, 16))
    recs = [r for r in LogReader(rank_dir(tmp_path / "run", 0)).records() if isinstance(r, TensorRecord)]
    assert {(type(r.step), r.step, type(r.microbatch), r.microbatch) for r in recs} == {
        (int, 2, int, 1),
        (int, 3, int, 1),
    }


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda tr: tr.step(-1).__enter__(), r"step index must be an int in 0\.\.\d+, found -1 \(int\)"),
        (lambda tr: tr.step(2.0).__enter__(), r"step index must be an int in 0\.\.\d+, found 2\.0 \(float\)"),
        (lambda tr: tr.microbatch(True), r"microbatch index must be an int in 0\.\.\d+, found True \(bool\)"),
        (
            lambda tr: tr.microbatch(torch.tensor(1.0)),
            r"microbatch index must be an int .*found tensor\(1\.\) \(Tensor\)",
        ),
    ],
)
def test_a_bad_step_or_microbatch_index_is_refused_where_it_is_given(tmp_path: Path, call, message: str) -> None:
    tracer = Tracer(Mixer(), None, out=tmp_path / "run", run=RunInfo("x"), options=MIXER)
    with tracer as tr, pytest.raises(UsageError, match=message):
        call(tr)
