"""Two costs Beam pays again and again while it builds and runs a small diff's pipeline, cut without changing what
it computes; the only module that reaches into Beam's internals (tests/pipelines/test_beam_internals.py fails loudly
when a Beam upgrade moves them).

- ``PipelineOptions.view_as`` builds an argument parser of every option class Beam knows (some 400 options) each
  time it is called, and Beam calls it ~250 times per diff. `CachedViewOptions` makes one view per options class:
  views share the options' values anyway (``view_as``'s documented contract), so one view per class is the same.
- Beam reads the signature of each DoFn method again for each of ~6,000 checks per diff
  (``apache_beam.transforms.core.get_function_args_defaults``). `remember_signatures` keeps what it read, per
  function, for plain functions and methods only: their signature cannot change without a new function object.

Both are fixed costs of every pipeline, whatever the logs' size: a study diffs one pair per node and part.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import core

_View = TypeVar("_View", bound=PipelineOptions)
_SIGNATURES_KEPT = 4096  # functions whose signature is kept; the pipeline's lambdas are new for every pipeline


class CachedViewOptions(PipelineOptions):
    """`PipelineOptions` whose ``view_as`` makes one view per options class and hands it out again. A copy carries
    no views (``__getstate__``): it makes its own, over its own values."""

    def view_as(self, cls: type[_View]) -> _View:
        views = self.__dict__.setdefault("_views", {})
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("_views", None)
        return state


# Absent from a Beam that moved it: then Beam reads signatures as it always did (the test says so, loudly).
_read: Callable[[Any], tuple[list[str], list[Any]]] | None = getattr(core, "get_function_args_defaults", None)
_kept: dict[tuple[types.FunctionType, bool], tuple[list[str], list[Any]]] = {}


def _remembered(f: Any) -> tuple[list[str], list[Any]]:
    assert _read is not None  # installed only where Beam has it
    if isinstance(f, types.MethodType) and isinstance(f.__func__, types.FunctionType):
        key = (f.__func__, True)
    elif isinstance(f, types.FunctionType):
        key = (f, False)
    else:
        return _read(f)  # builtins, partials, callable objects: read each time, as Beam does
    found = _kept.get(key)
    if found is None:
        if len(_kept) >= _SIGNATURES_KEPT:
            _kept.clear()
        found = _kept[key] = _read(f)
    return list(found[0]), list(found[1])  # the caller may change its lists: never the kept ones


def remember_signatures() -> None:
    """Have Beam read each function's signature once (idempotent)."""
    if _read is not None:
        core.get_function_args_defaults = _remembered
