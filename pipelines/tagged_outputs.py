"""Several outputs from one step, on every runner: elements are (tag, value), `split` selects per tag.

Steps emit ``(tag, value)`` pairs; `split` turns them into one PCollection per tag with
Beam's idiom, ``ParDo(...).with_outputs(...)``: one step, fused with its producer.
The DaskRunner (Beam 2.77) hands every output of a ParDo to every consumer of any of
its tags, so there a selecting FlatMap per tag does the job instead (one comparison per
element; elements here are whole batches). Each step costs a local runner milliseconds
to set up whatever its data, so the Beam idiom is the default.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam


def split(pcoll: beam.PCollection, tags: Iterable[str], label: str) -> dict[str, beam.PCollection]:
    """{tag: the values of the (tag, value) elements of `pcoll` with that tag}."""
    tags = list(tags)
    if type(pcoll.pipeline.runner).__name__ == "DaskRunner":
        return {tag: pcoll | f"{label} {tag}" >> beam.FlatMap(_select, tag) for tag in tags}
    outputs = pcoll | label >> beam.ParDo(_Tagged(frozenset(tags))).with_outputs(*tags)
    return {tag: outputs[tag] for tag in tags}


def _select(element: tuple[str, Any], tag: str) -> tuple[Any, ...]:
    return (element[1],) if element[0] == tag else ()


class _Tagged(beam.DoFn):
    """(tag, value) -> value, to the output of that tag; elements of other tags are not wanted here."""

    def __init__(self, tags: frozenset[str]) -> None:
        self.tags = tags

    def process(self, element: tuple[str, Any]) -> Iterator[beam.pvalue.TaggedOutput]:
        if element[0] in self.tags:
            yield beam.pvalue.TaggedOutput(element[0], element[1])
