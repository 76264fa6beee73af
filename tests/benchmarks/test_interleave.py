"""The benchmarks' side-by-side timing: shuffled order, every steady step counted in a ratio of means with its
interval, the writer's delayed work inside the step that caused it, the first steps reported as one-time cost."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest


def test_each_step_runs_every_variant_once_in_a_shuffled_order(timing) -> None:
    calls: list[tuple[str, int]] = []

    def variant(name: str, seconds):
        def run(step: int) -> float:
            calls.append((name, step))
            return seconds(step)

        return run

    # The machine slows down tenfold halfway through; each step's ratio stays 2.
    slow = lambda step: 1.0 if step < 10 else 10.0  # noqa: E731
    timed = timing.interleave({"base": variant("base", slow), "twice": variant("twice", lambda s: 2 * slow(s))}, 20)
    steps = 20 + timing.WARMUP
    assert sorted(calls) == sorted((n, s) for n in ("base", "twice") for s in range(steps))
    firsts = {calls[2 * s][0] for s in range(steps)}
    assert firsts == {"base", "twice"}, "one variant always ran first"
    assert len(timed.seconds["base"]) == 20 and len(timed.warmup["base"]) == timing.WARMUP
    r = timed.ratio("twice", "base")
    assert (r.value, r.low, r.high, r.samples) == pytest.approx((2.0, 2.0, 2.0, 20))
    assert timed.mean("twice") > timed.mean("base")
    assert timed.describe("twice", "base").startswith("2.000 (95 % CI 2.000-2.000, n=20)")


def test_the_writers_delayed_work_is_counted_in_the_step_when_drained(timing) -> None:
    writer = ThreadPoolExecutor(1)  # a step hands its records over and returns; this thread writes them later
    pending: list[Future] = []

    def step(index: int) -> None:
        pending.append(writer.submit(time.sleep, 0.05))

    def drain() -> None:
        while pending:
            pending.pop().result()

    try:
        timed = timing.interleave(
            {"plain": timing.drained(lambda index: None, lambda: None), "traced": timing.drained(step, drain)},
            4,
            warmup=1,
        )
    finally:
        writer.shutdown()
    assert all(t >= 0.05 for t in timed.seconds["traced"]), timed.seconds
    assert all(t < 0.05 for t in timed.seconds["plain"]), "the traced step's writer work landed in a plain step"
    assert timed.ratio("traced", "plain").value > 1


def test_the_first_steps_are_reported_as_one_time_cost_not_dropped(timing) -> None:
    # The traced variant's first step loads a kernel (5 s once); every other step costs the same as the plain one.
    timed = timing.interleave({"plain": lambda step: 1.0, "traced": lambda step: 6.0 if step == 0 else 1.0}, 10)
    assert timed.warmup["traced"][0] == 6.0
    assert timed.first_steps("traced") == pytest.approx(5.0) and timed.first_steps("plain") == pytest.approx(0.0)
    assert timed.ratio("traced", "plain").value == pytest.approx(1.0)
    assert "+5.000 s vs +0.000 s over steady ones (one-time)" in timed.describe("traced", "plain", 1.05)


def test_the_tracers_start_and_close_are_timed_apart(timing) -> None:
    class Slow:
        exited: object = "not yet"

        def __enter__(self) -> Slow:
            time.sleep(0.02)
            return self

        def __exit__(self, *exc: object) -> None:
            self.exited = exc[0]
            time.sleep(0.03)

    noted: dict[str, float] = {}
    with timing.lifetime(Slow(), noted) as entered:
        assert noted["start_s"] >= 0.02 and "close_s" not in noted
    assert noted["close_s"] >= 0.03 and entered.exited is None
    one_time = timing.OneTime(noted["start_s"], 0.1, noted["close_s"])
    assert one_time.describe().startswith(f"one-time {noted['start_s'] + 0.1 + noted['close_s']:.3f} s: start")
    failing = Slow()
    with pytest.raises(KeyError), timing.lifetime(failing, {}):
        raise KeyError("the training failed")
    assert failing.exited is KeyError


def test_a_verdict_is_undecided_only_while_the_target_lies_inside_the_interval(timing, intervals) -> None:
    wide = intervals.Ratio(1.04, 1.03, 1.06, 10)
    assert "width 0.030: the target lies inside the interval, run more steps" in timing.width(wide, 1.05)
    assert "width 0.030: decided" in timing.width(wide, 1.10)  # met: the upper end is below it
    assert "width 0.030: decided" in timing.width(wide, 1.02)  # not met whatever more steps show
    assert timing.width(wide, None) == "interval width 0.030"
    assert timing.disagree(wide, intervals.Ratio(1.10, 1.07, 1.12, 5))
    assert not timing.disagree(wide, intervals.Ratio(1.08, 1.055, 1.12, 5))
