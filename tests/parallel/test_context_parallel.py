"""Context parallelism on CPU and gloo (2 ranks): what torch's ``context_parallel`` does here, measured, and the
Tracer's one-line refusal of a site that runs inside it.

Launches: two 2-rank jobs (`tests.parallel.cp_ranks`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch import launch

FINDING = (
    "NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a "
    "sharding strategy registered."
)

pytestmark = pytest.mark.slow  # ranks are processes


def test_torchs_context_parallel_attention_fails_on_cpu_with_gloo() -> None:
    """The finding docs/parallel.md quotes: if a torch release makes it run, this fails, and the docs must change."""
    results = launch("tests.parallel.cp_ranks:ring_attention", {}, 2)
    assert results == [FINDING] * 2, results


def test_the_tracer_refuses_a_site_inside_context_parallel_in_one_line(tmp_path: Path) -> None:
    results = launch("tests.parallel.cp_ranks:traced", {"out": str(tmp_path / "run")}, 2)
    for line in results:
        assert line.startswith("ConfigError: context parallelism: a traced site ran inside torch's context_parallel")
        assert "\n" not in line and "trace the run without context_parallel" in line, line
