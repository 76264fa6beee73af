"""Several outputs from one step, on every runner: elements are (tag, value), `split` selects per tag.

Beam's idiom is ``ParDo(...).with_outputs(...)``, but the DaskRunner (Beam 2.77) hands
every output of a ParDo to every consumer of any of its tags. A selecting FlatMap per
tag costs one comparison per element (elements here are whole batches) and works on
every runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import apache_beam as beam


def split(pcoll: beam.PCollection, tags: Iterable[str], label: str) -> dict[str, beam.PCollection]:
    """{tag: the values of the (tag, value) elements of `pcoll` with that tag}."""
    return {tag: pcoll | f"{label} {tag}" >> beam.FlatMap(_select, tag) for tag in tags}


def _select(element: tuple[str, Any], tag: str) -> tuple[Any, ...]:
    return (element[1],) if element[0] == tag else ()
