"""torchtitan's own debug Llama3 (its model code, random init, no download) split into pipeline stages by
torchtitan's own ``pipeline_llm`` (its module split, its ``PipelineStage`` and schedule; each stage parallelized by
its ``parallelize_llama``), one stage per gloo rank, trained under the workload protocol.

Needs the ``[torchtitan]`` extra. From the repository root (``--workload`` imports ``examples.torchtitan_pipeline``)::

    sdc record --workload examples.torchtitan_pipeline:build --nproc 2 --out runs/titan-pp          # 1F1B, 2 stages
    sdc record --workload examples.torchtitan_pipeline:build --nproc 2 --out runs/titan-pp-sick \\
        --fault-profile my-stage1-fault.toml                                # a rule with ranks = [1]
    sdc record --workload examples.torchtitan_pipeline:build --nproc 2 --set parallel.schedule=GPipe --out runs/g
    sdc diff --golden runs/titan-pp --suspect runs/titan-pp-sick --db pp.duckdb && sdc query summary --db pp.duckdb
    sdc replay --golden runs/titan-pp --suspect runs/titan-pp-sick --workload examples.torchtitan_pipeline:build \\
        --nproc 2 --steps 3:4 --mode lockstep --out runs/titan-pp-lockstep

The debug flavour's 6 layers split as torchtitan splits them (``tok_embeddings`` and ``layers.0``-``2`` on stage 0,
``layers.3``-``5``, ``norm`` and ``lm_head`` on stage 1 of 2), each stage keeping torchtitan's global module names
(``layers.4.feed_forward`` on stage 1). The step's ``train.microbatches`` x ``train.batch`` rows go to the
schedule, which splits them into its pipeline microbatches of ``train.batch`` rows; the log's microbatch is the
pipeline's. examples/torchtitan_llama3.py's CPU changes apply, and three for the Tracer
(`workload.titan_internals.pipeline`): the stage torchtitan builds is made a `tracer.pipeline.TracedStage`, its
module's input and output are the ``recv`` and ``send`` collective events (``pipeline.0-1.send.in`` ...), and the
schedule averages the microbatches' gradients (torch's default; torchtitan's own loss divides by the global token
count instead). The workload is examples/torchrun_pipeline.py's `PipelineLM`: each stage saves its own checkpoint,
replay restores each stage from it. No gradient clipping (the norm would need the stages' norms together).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.config.configs import TrainingConfig

from examples.torchrun_fsdp2 import with_defaults
from examples.torchrun_pipeline import PipelineLM, next_token_loss
from examples.torchtitan_llama3 import SETTINGS
from tracer import Layout, Pipeline, SdcError, configure_determinism
from workload.titan_internals import (
    debug_llama3,
    infer_stage_shapes,
    parallel_dims_of,
    pipeline,
    sum_gradients,
    use_cpu_meshes,
    use_spmd_backend,
)

SCHEDULES = ("1F1B", "GPipe")  # torchtitan's names; one stage per rank
CONFIG: dict[str, dict[str, Any]] = {
    "model": {"vocab": 2048},  # the debug flavour's
    "train": {**SETTINGS, "lr": 1e-3, "batch": 1, "seq": 16, "microbatches": 4, "clip": 0.0},
    "parallel": {"schedule": "1F1B"},
    "run": {"steps": 6, "checkpoint_every": 2},
}


def float_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The next-token loss in float32: FSDP2 under ``parallelize_llama`` computes in bfloat16, so the last stage's
    logits are bfloat16 (the loss broadcast to every stage is float32)."""
    return next_token_loss(logits.float(), targets)


def build(config: Mapping[str, Any], device: torch.device) -> PipelineLM:
    """The workload factory (`workload.protocol`): torchtitan's debug Llama3 split by its ``pipeline_llm`` into one
    stage per rank under the schedule ``parallel.schedule``; the whole model without a process group."""
    config = with_defaults(config, CONFIG)
    t, schedule_name = config["train"], config["parallel"]["schedule"]
    if schedule_name not in SCHEDULES:
        raise SdcError(f"parallel.schedule = {schedule_name!r}: expected one of {list(SCHEDULES)}")
    stages = dist.get_world_size() if dist.is_initialized() else 1
    configure_determinism(t["seed"], t["threads"])  # the same initial weights on every twin
    use_cpu_meshes()
    more = {"pipeline_parallel_schedule": schedule_name, "pipeline_parallel_microbatch_size": t["batch"]}
    dims, parallelism = parallel_dims_of(1, 1, pipeline_parallel_degree=stages, **more)
    use_spmd_backend(parallelism)
    model_config = debug_llama3(parallelism)
    with torch.device("meta"):
        model = model_config.build()
    stage = schedule = None
    if stages > 1:
        training = TrainingConfig(local_batch_size=t["batch"] * t["microbatches"], seq_len=t["seq"])
        with tempfile.TemporaryDirectory() as scratch:
            schedule, model, stage = pipeline(model, model_config, dims, parallelism, training, float_loss, scratch)
        sum_gradients(model)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    if stage is not None:
        infer_stage_shapes(schedule, stage, t["batch"], t["seq"])  # untraced, here rather than at step 0
    layout = Layout(pp=stages, pipeline=Pipeline(schedule_name, t["microbatches"])) if stages > 1 else Layout()
    return PipelineLM(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=t["lr"], foreach=False),
        config=config,
        seed=t["seed"],
        layout=layout,
        data_order_fingerprint=f"random-tokens/seed={t['seed']}/replicas=1",
        stages=[stage] if stage is not None else [],
        schedule=schedule,
    )
