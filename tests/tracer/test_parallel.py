"""The rank layout (`tracer.parallel.Layout`): pipeline stages after data- and tensor-parallel ranks, the header's
pipeline block, and pairing that refuses another schedule."""

from __future__ import annotations

import pytest

from tracer.errors import CaptureError
from tracer.parallel import LAYOUT_FIELDS, Layout, Pipeline, layout_of, pipeline_of


def test_pipeline_stages_come_after_data_and_tensor_parallel_ranks() -> None:
    layout = Layout(dp=2, tp=2, pp=2, pipeline=Pipeline("GPipe", microbatches=4))
    assert layout.world_size == 8
    assert [layout.coords(r) for r in (0, 3, 5)] == [
        {"dp": 0, "tp": 0, "pp": 0},
        {"dp": 1, "tp": 1, "pp": 0},
        {"dp": 0, "tp": 1, "pp": 1},
    ]
    assert layout.stage_ranks() == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    assert Layout(dp=2, tp=2).coords(3) == {"dp": 1, "tp": 1}  # no pipeline: the coordinates of before


def test_the_header_records_the_schedule_its_microbatches_and_the_stage_to_rank_map() -> None:
    header = Layout(pp=2, pipeline=Pipeline("1F1B", microbatches=4)).header(1)
    assert header == {
        "dp": 1,
        "tp": 1,
        "sp": False,
        "coords": {"dp": 0, "tp": 0, "pp": 1},
        "pp": 2,
        "pipeline": {"schedule": "1F1B", "microbatches": 4, "stage_ranks": {"0": [0], "1": [1]}},
    }
    assert pipeline_of({"parallel": header}) == header["pipeline"]
    assert pipeline_of({"parallel": Layout(dp=2).header(0)}) is None and pipeline_of({}) is None
    assert "pp" not in Layout(dp=2).header(0)  # headers without a pipeline are as they were
    assert {"pp", "pipeline"} <= set(LAYOUT_FIELDS)
    assert layout_of({"parallel": header}, 2)["pipeline"]["schedule"] == "1F1B"


def test_a_pipeline_needs_its_schedule_and_the_ranks_it_spans() -> None:
    with pytest.raises(CaptureError, match="needs its schedule"):
        Layout(pp=2)
    with pytest.raises(CaptureError, match="needs its schedule"):
        Layout(pipeline=Pipeline("GPipe", 2))
    with pytest.raises(CaptureError, match="at least 1"):
        Pipeline("GPipe", 0)
    with pytest.raises(CaptureError, match=r"dp=1 x tp=1 x pp=4 needs 4 ranks, but torch.distributed has world size 2"):
        Layout(pp=4, pipeline=Pipeline("GPipe", 2)).check(2)


def test_an_interleaved_pipeline_puts_stage_s_on_position_s_mod_pp_and_names_each_stages_modules() -> None:
    modules = (("embed", "blocks.0"), ("blocks.1",), ("blocks.2",), ("blocks.3", "head"))
    layout = Layout(dp=2, pp=2, pipeline=Pipeline("Interleaved1F1B", 4, stages_per_rank=2, stage_modules=modules))
    assert (layout.world_size, layout.stages) == (4, 4)
    assert layout.stage_ranks() == {"0": [0, 1], "1": [2, 3], "2": [0, 1], "3": [2, 3]}
    pipeline = layout.header(2)["pipeline"]
    assert (pipeline["stages_per_rank"], pipeline["stage_modules"]["3"]) == (2, ["blocks.3", "head"]), pipeline
    with pytest.raises(CaptureError, match="a rank holds at least 1 stage"):
        Pipeline("Interleaved1F1B", 4, stages_per_rank=0)
    with pytest.raises(CaptureError, match="stage_modules are for several stages per rank"):
        Pipeline("1F1B", 4, stage_modules=modules)
