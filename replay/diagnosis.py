"""Why re-executing the golden run diverged from its log, where sdctrace can tell.

Replay checks every re-executed fingerprint against the golden log (`replay.golden`). Before a mismatch is put
down to the machine, what sdctrace can see on its own side is named, with its fix:

- precision: a tensor the recording computed in one dtype is computed in another here: the recording ran under
  an autocast or precision setting that the replay workload does not, or the reverse;
- the global torch RNG: the state at the step's start is not the recording's and the log does not hold it,
  or the log holds no RNG state at step starts at all (recorded before `rng` events, tracer/rng.py) while
  modules draw from it in training mode (dropout with p > 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

from replay.golden import GoldenMismatch, Key, index_key

DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def dropout_modules(model: nn.Module) -> list[str]:
    """Paths of the dropout modules with p > 0 in training mode: each draws from the global RNG every forward."""
    return [name for name, m in model.named_modules() if isinstance(m, DROPOUT) and m.p > 0 and m.training]


def likely_causes(
    mismatches: Sequence[GoldenMismatch],
    metas: Mapping[Key, str],
    model: nn.Module,
    *,
    logs_rng: bool,
    rng_problem: str | None,
    checkpoint: int,
) -> list[str]:
    """What sdctrace can detect that makes the re-execution differ, each with its fix; empty if nothing."""
    causes = []
    for d in mismatches:
        recorded, here = _dtype(metas.get(index_key(d.step, d.microbatch, d.name, d.phase), "")), _dtype(d.meta)
        if recorded and here and recorded != here:
            causes.append(
                f"precision: {d.phase.name.lower()} {d.name} is {recorded} in the recording and {here} here, so the "
                "recording ran under an autocast or mixed precision that the replay workload does not (or the "
                "reverse); build the workload with the recording's precision (the same TrainingArguments(bf16=..., "
                "fp16=...), Lightning Trainer(precision=...), or torch.autocast around your loss)"
            )
            break
    step = mismatches[0].step if mismatches else checkpoint
    dropout = dropout_modules(model)
    shown = ", ".join(dropout[:3]) + (f" and {len(dropout) - 3} more" if len(dropout) > 3 else "")
    if rng_problem is not None:
        drawn = f"; {shown} draw from it (dropout in training mode)" if dropout else ""
        causes.append(f"the global RNG: {rng_problem}{drawn}")
    elif dropout and not logs_rng:
        causes.append(
            f"the global RNG: {shown} draw from it (dropout in training mode), and this log holds no RNG state at "
            f"step starts (recorded by an sdctrace before `rng` events), so whatever drew from it between checkpoint "
            f"{checkpoint} and step {step} in the recording (a data loader's iterator does, at each epoch's start) "
            "is not repeated here; replay from a checkpoint inside an epoch, or record the run again"
        )
    return causes


def _dtype(meta: str) -> str:
    """``"bfloat16[2,16,32]"`` -> ``"bfloat16"``."""
    return meta.partition("[")[0]
