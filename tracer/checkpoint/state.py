"""What both checkpoint implementations store beside model and optimizer, without pickle: every RNG's state, and
the state of the other objects a training names, split into tensors (safetensors) and the rest (msgpack).

    plain, tensors = rng_state()                      # Python's and NumPy's in msgpack, torch's as tensors
    rng_problem(manifest["rng"])                      # what is wrong with a manifest's rng map, before it is used
    set_rng_state({**plain, "torch": tensors["rng/torch"], "cuda": []})
    plain = split_tensors(sched.state_dict(), "state/sched", tensors); join_tensors(plain, tensors)
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping
from typing import Any

import torch

from tracer.errors import LogError


def rng_problem(rng: Any) -> str | None:
    """What is wrong with a manifest's ``rng`` map (as `rng_state` makes it); None if nothing."""
    if not (
        isinstance(rng, dict)
        and isinstance(rng.get("python"), list)
        and len(rng["python"]) == 3
        and type(rng["python"][0]) is int
        and isinstance(rng["python"][1], list)
        and len(rng["python"][1]) == 625
        and all(type(x) is int and 0 <= x < 1 << 32 for x in rng["python"][1])
        and rng["python"][1][-1] <= 624
        and (rng["python"][2] is None or isinstance(rng["python"][2], float))
    ):
        return "'rng.python' must be [version, 625 ints < 2**32 (the last <= 624), float or nil] (random.getstate())"
    numpy_state = rng.get("numpy")
    if numpy_state is not None and not (
        isinstance(numpy_state, list)
        and len(numpy_state) == 5
        and isinstance(numpy_state[0], str)
        and isinstance(numpy_state[1], list)
        and len(numpy_state[1]) == 624
        and all(type(x) is int and 0 <= x < 1 << 32 for x in numpy_state[1])
        and type(numpy_state[2]) is int
        and 0 <= numpy_state[2] <= 624
        and type(numpy_state[3]) is int
        and isinstance(numpy_state[4], float)
    ):
        return "'rng.numpy' must be [name, 624 ints < 2**32, pos 0..624, has_gauss, float] (numpy.random.get_state())"
    return None


_TENSOR_REF = "__sdctrace_tensor__"


def split_tensors(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` with every tensor moved into ``tensors`` (under ``path``) and replaced by a reference."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().to("cpu", copy=True).contiguous()
        return {_TENSOR_REF: path}
    if isinstance(value, Mapping):
        return {k: split_tensors(v, f"{path}/{k}", tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [split_tensors(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    raise LogError(
        f"checkpoint state {path!r}: cannot store a {type(value).__name__} without pickle; "
        "keep state_dict() to tensors, numbers, strings, lists and dicts"
    )


def join_tensors(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """``value`` with each reference `split_tensors` left replaced by its tensor."""
    if isinstance(value, dict):
        if set(value) == {_TENSOR_REF}:
            ref = value[_TENSOR_REF]
            if ref not in tensors:
                raise LogError(f"checkpoint state refers to a tensor {ref!r} that it does not hold")
            return tensors[ref]
        return {k: join_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [join_tensors(v, tensors) for v in value]
    return value


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Every RNG's state: the plain part (Python's, numpy's) for the manifest, the tensors by their names."""
    version, mt_state, gauss = random.getstate()
    plain: dict[str, Any] = {"python": [version, list(mt_state), gauss]}
    if "numpy" in sys.modules:  # data pipelines draw from it (HF Trainer seeds it too)
        name, keys, pos, has_gauss, cached = sys.modules["numpy"].random.get_state()
        plain["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i:03d}"] = s
    return plain, tensors


def set_rng_state(rng: dict[str, Any]) -> None:
    """Put back what `rng_state` took (its tensors under ``torch`` and ``cuda``)."""
    version, mt_state, gauss = rng["python"]
    random.setstate((version, tuple(mt_state), gauss))
    if rng.get("numpy") is not None:
        import numpy as np

        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if rng.get("torch") is not None:
        torch.set_rng_state(rng["torch"])
    if rng.get("cuda"):
        torch.cuda.set_rng_state_all(rng["cuda"])
