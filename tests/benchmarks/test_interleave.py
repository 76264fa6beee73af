"""The benchmarks' side-by-side timing: shuffled order, per-step ratios, warm-up left out."""

from __future__ import annotations


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
    assert sorted(calls) == sorted((n, s) for n in ("base", "twice") for s in range(20))
    firsts = {calls[2 * s][0] for s in range(20)}
    assert firsts == {"base", "twice"}, "one variant always ran first"
    assert len(timed.seconds["base"]) == 20 - timing.warmup(20)
    assert timed.ratio("twice", "base") == 2.0
    assert timed.spread("twice", "base") == (2.0, 2.0)
    assert timed.median("twice") > timed.median("base")
    assert "2.000" in timed.describe("twice", "base")
