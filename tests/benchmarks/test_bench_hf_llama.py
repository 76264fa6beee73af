"""benchmarks/bench_tracing.py's third-party model: a Hugging Face Llama traced as any model, its lines printed
like a size's, its ratio from the steady steps only and its one-time cost apart. Never a speed."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tracer.log import LogReader, rank_dir
from tracer.log.records import Phase, TensorRecord

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench_tracing() -> ModuleType:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(BENCHMARKS))  # it imports timing and whole_run from beside it, as run.py does
    try:
        return importlib.import_module("bench_tracing")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.slow  # transformers' import and 14 steps of each copy: a minute on a loaded machine
def test_the_hf_llama_lines_print_from_its_steady_steps(
    bench_tracing: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = bench_tracing.bench_hf_llama(2, out=tmp_path / "run")  # --steps 2: the least, 4 steady steps
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    # The ratio with its interval over the 4 steady steps, its verdict against tiny's target, the warm-up apart.
    assert re.match(
        r"  hf-llama \(tiny\)\s+\d+\.\d M params  steady: \d+\.\d+ \(95 % CI \d+\.\d+-\d+\.\d+, n=4\), "
        r"target <= 1\.05: (met|NOT met); interval width .*; first 3 steps .* \(one-time\)$",
        lines[0],
    ), lines[0]
    assert "Hugging Face LlamaForCausalLM" in lines[1] and " s in all" in lines[1]
    warmup = sys.modules["timing"].WARMUP
    assert {len(t) for t in r.steps.seconds.values()} == {4}  # the ratio's samples: steady steps only
    assert {len(t) for t in r.steps.warmup.values()} == {warmup}
    assert r.one_time.start_s > 0 and r.one_time.close_s > 0
    assert r.params == sum(p.numel() for p in bench_tracing.HfLlama().model.parameters())
    # Traced through the Tracer's default sites on the Hugging Face model: every decoder layer, every step.
    records = [x for x in LogReader(rank_dir(tmp_path / "run", 0)).records() if isinstance(x, TensorRecord)]
    forward = {(x.step, x.name) for x in records if x.phase == Phase.FORWARD}
    layers = {name for _, name in forward}
    assert {f"model.layers.{i}" for i in range(4)} <= {n.rsplit(".", 1)[0] for n in layers}, sorted(layers)
    assert {step for step, _ in forward} == set(range(4 + warmup))
    assert {x.phase for x in records} >= {Phase.INPUT, Phase.FORWARD, Phase.BACKWARD, Phase.GRAD, Phase.PARAM}
