"""The suite's time budget: ``--budget-s S`` prints the 15 slowest tests and fails the run when one took longer than
S seconds (setup, call and teardown together), naming it. `make test` sets it (Makefile, TEST_BUDGET_S), so a test
that grows past the budget fails CI instead of slowing every change down; split it or share its fixture.

A module fixture's cost lands on the first test that uses it: that test carries the whole fixture."""

from __future__ import annotations

from collections import defaultdict

import pytest

SHOWN = 15


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--budget-s",
        type=float,
        default=None,
        help="fail when a test (setup + call + teardown) takes longer than this many seconds; print the 15 slowest",
    )


class Budget:
    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def over(self) -> list[tuple[str, float]]:
        return [(test, s) for test, s in self.slowest(len(self.seconds)) if s > self.limit]

    def slowest(self, n: int) -> list[tuple[str, float]]:
        return sorted(self.seconds.items(), key=lambda item: -item[1])[:n]

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.section(f"the {SHOWN} slowest tests (budget {self.limit:g} s each)")
        for test, s in self.slowest(SHOWN):
            terminalreporter.write_line(f"{s:8.1f} s  {test}{'  OVER BUDGET' if s > self.limit else ''}")
        over = self.over()
        if over:
            names = ", ".join(f"{test} ({s:.1f} s)" for test, s in over)
            terminalreporter.write_line(f"{len(over)} over the budget of {self.limit:g} s: {names}", red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.over() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    limit = config.getoption("--budget-s")
    # Under xdist the workers report to the controller, which alone keeps the budget.
    if limit is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Budget(limit), "sdc-budget")
