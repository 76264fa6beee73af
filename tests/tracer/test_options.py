"""The Tracer's typed options: checked when built, carried through JSON to launched ranks, and obeyed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.tracer.user_models import tiny_sequential
from tracer.errors import ConfigError
from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord
from tracer.options import CapturePolicy, RunInfo, TraceOptions
from tracer.tracing import Tracer


def test_trace_options_round_trip_through_json_data() -> None:
    options = TraceOptions(
        sites=r"layers\.\d+\.attention",
        segment_bytes=1 << 20,
        gradients=False,
        capture=CapturePolicy(steps=frozenset({0, 5}), every=10, names="layers.*", phases=frozenset({Phase.FORWARD})),
    )
    assert TraceOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    assert TraceOptions.from_dict({}) == TraceOptions()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TraceOptions.from_dict({"site": "x"}), r"unknown trace option\(s\) site; known: activations, "),
        (lambda: TraceOptions.from_dict({"capture": {"phases": ["fwd"]}}), r"capture phase 'FWD' is not one of"),
        (lambda: TraceOptions(segment_bytes=0), r"TraceOptions.segment_bytes = 0: must be > 0"),
        (lambda: TraceOptions(gradients="no"), r"TraceOptions.gradients = 'no': must be bool, found str"),
        (lambda: TraceOptions(sites=["0"]), r"a list of sites must hold modules"),
        (lambda: TraceOptions(sites=list(tiny_sequential())).to_dict(), r"only a regex .* can be passed on as JSON"),
        (lambda: RunInfo("n", seed="1"), r"RunInfo.seed = '1': must be int, found str"),
        (lambda: RunInfo(7), r"RunInfo.node_label = 7: must be str"),
        (lambda: Tracer(tiny_sequential(), None, out="x", run="node-7"), r"takes a RunInfo, found str"),
    ],
)
def test_a_wrong_option_fails_where_it_is_written_naming_the_field(build, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


def record(out: Path, options: TraceOptions) -> Counter:
    model = tiny_sequential()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Tracer(model, opt, out=out, run=RunInfo("x", seed=3), options=options) as tr, tr.step(0):
        x = torch.randn(4, 8)
        tr.microbatch(0, inputs=x)
        model(x).sum().backward()
        opt.step()
    assert LogReader(rank_dir(out, 0)).header.seed == 3
    return Counter(r.phase for r in LogReader(rank_dir(out, 0)).records() if isinstance(r, TensorRecord))


def test_the_switches_choose_what_is_recorded(tmp_path: Path) -> None:
    everything = record(tmp_path / "all", TraceOptions(sites="0|2"))
    assert everything == {Phase.INPUT: 1, Phase.FORWARD: 2, Phase.BACKWARD: 2, Phase.GRAD: 4, Phase.PARAM: 4}
    only_params = record(tmp_path / "p", TraceOptions(activations=False, gradients=False))
    assert only_params == {Phase.INPUT: 1, Phase.PARAM: 4}
