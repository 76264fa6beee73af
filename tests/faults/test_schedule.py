"""The burst chain: deterministic from its seed, bursty as configured, windowed."""

from __future__ import annotations

from faults.schedule import BurstChain, Schedule

BURSTY = Schedule(p_enter=0.1, p_exit=0.5)


def states(chain: BurstChain, steps: int) -> list[bool]:
    return [chain.armed(s) for s in range(steps)]


def test_the_same_seed_gives_the_same_bursts_in_any_query_order() -> None:
    a = states(BurstChain(BURSTY, "s"), 300)
    late = BurstChain(BURSTY, "s")
    assert late.armed(299) == a[299] and late.armed(5) == a[5]  # a replay may ask for one step first
    assert states(late, 300) == a
    assert states(BurstChain(BURSTY, "t"), 300) != a


def test_bursts_have_the_configured_rate_and_length() -> None:
    on = states(BurstChain(BURSTY, "rate"), 20000)
    # Stationary share of burst steps p_enter / (p_enter + p_exit) = 1/6; mean burst length 1 / p_exit = 2.
    assert abs(sum(on) / len(on) - 1 / 6) < 0.02
    runs = "".join("1" if x else "0" for x in on).replace("0", " ").split()
    assert abs(sum(map(len, runs)) / len(runs) - 2.0) < 0.15


def test_the_window_and_step_list_restrict_every_state() -> None:
    always = Schedule(start=3, stop=8)
    assert [s for s in range(12) if BurstChain(always, "w").armed(s)] == [3, 4, 5, 6, 7]
    listed = Schedule(start=3, steps=(1, 4, 9))
    assert [s for s in range(12) if BurstChain(listed, "w").armed(s)] == [4, 9]
    assert not any(states(BurstChain(Schedule(p_enter=0.0), "w"), 100))
