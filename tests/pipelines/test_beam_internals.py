"""pipelines/beam_internals.py against the Beam installed: the internals it reaches are there (this fails loudly
when an upgrade moves them), what it remembers is what Beam reads, and its option views behave as Beam's."""

from __future__ import annotations

import copy
import functools

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TypeOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core

from pipelines import beam_internals
from pipelines.beam_internals import CachedViewOptions, remember_signatures


class _Scale(beam.DoFn):
    def process(self, element, factor=2, *rest, timestamp=beam.DoFn.TimestampParam):
        yield element * factor


class _Callable:
    def __call__(self, a, b=1):
        return a + b


def _free(a, b, c=3):
    return a + b + c


def test_beam_still_has_the_function_whose_reads_are_remembered() -> None:
    assert beam_internals._read is not None, "apache_beam.transforms.core.get_function_args_defaults moved"
    remember_signatures()
    assert core.get_function_args_defaults is beam_internals._remembered
    # Beam's own callers look the name up when they run: they reach the remembered reads
    fn = _Scale()
    assert core.get_function_arguments(fn, "process") == beam_internals._read(fn.process)


def test_remembered_signatures_are_what_beam_reads_and_the_lists_handed_out_are_fresh() -> None:
    remember_signatures()
    read = beam_internals._read
    assert read is not None
    for f in (_Scale().process, _Scale.process, _free, lambda x, y=0: x, functools.partial(_free, 1), _Callable(), len):
        for _ in range(2):  # the second call answers from what was kept
            assert core.get_function_args_defaults(f) == read(f), f
    # two DoFn instances share their method's entry; a bound method does not share the unbound function's
    assert core.get_function_args_defaults(_Scale().process) == (["element", "factor"], [2])
    assert core.get_function_args_defaults(_Scale.process) == (["self", "element", "factor"], [2])
    args, defaults = core.get_function_args_defaults(_free)
    args.append("changed")
    defaults.clear()
    assert core.get_function_args_defaults(_free) == (["a", "b", "c"], [3])


def test_one_view_per_class_sharing_the_options_values_as_beams_views_do() -> None:
    opts = CachedViewOptions(["--runner=FnApiRunner", "--direct_running_mode=in_memory"])
    standard = opts.view_as(StandardOptions)
    assert opts.view_as(StandardOptions) is standard and standard.runner == "FnApiRunner"
    assert opts.view_as(DirectOptions).direct_running_mode == "in_memory"
    standard.runner = "DirectRunner"  # a value set through one view is every view's
    assert opts.view_as(StandardOptions).runner == "DirectRunner"
    assert opts.get_all_options()["runner"] == "DirectRunner"
    # a copy (Beam's Pipeline deep-copies its options) has its own values and views
    twin = copy.deepcopy(opts)
    twin.view_as(StandardOptions).runner = "FnApiRunner"
    assert opts.view_as(StandardOptions).runner == "DirectRunner"
    assert twin.view_as(StandardOptions).runner == "FnApiRunner"
    assert twin.view_as(StandardOptions) is not standard
    # a copy's state (``__getstate__``, what Beam's own serialisers read too) carries the values, no views
    again = copy.copy(opts)
    assert "_views" not in again.__dict__ and again.view_as(StandardOptions).runner == "DirectRunner"
    assert type(again) is CachedViewOptions
    # as plain options: the same values
    plain = PipelineOptions(["--runner=FnApiRunner", "--direct_running_mode=in_memory"])
    fresh = CachedViewOptions(["--runner=FnApiRunner", "--direct_running_mode=in_memory"])
    assert fresh.get_all_options() == plain.get_all_options()
    assert fresh.view_as(TypeOptions).pipeline_type_check == plain.view_as(TypeOptions).pipeline_type_check


def test_a_pipeline_on_these_options_runs_with_type_checks_and_remembered_signatures() -> None:
    remember_signatures()
    with beam.Pipeline(options=CachedViewOptions(["--runner=FnApiRunner"])) as p:
        doubled = p | beam.Create([1, 2, 3]) | beam.ParDo(_Scale(), 10)
        assert_that(doubled, equal_to([10, 20, 30]))
