"""Where the suite's time goes: a pytest plugin (tests/conftest.py registers it) that adds up each test's setup, call
and teardown by tier (`fast`: what `make test-fast` runs; `e2e`: the Ray tier) and by folder, and prints them beside
the tier's budget at the end of every run, so CI's output records them run after run.

The budgets are recorded, never asserted: the same commit takes 1.6x longer on one 2-vCPU machine kind than on
another (docs/testing.md), and speed is measured in benchmarks, not failed in tests."""

from __future__ import annotations

from collections import defaultdict

import pytest

# Seconds per tier that keep `make test` under 25 minutes on the slowest 2-vCPU kind seen (docs/testing.md).
BUDGET_S = {"fast": 600.0, "e2e": 900.0}


def tier_of(keywords: object) -> str:
    return "e2e" if "e2e" in keywords else "fast"  # type: ignore[operator]


class SuiteTimes:
    """Seconds per test (setup + call + teardown), its tier and its folder under tests/."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tier: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        self.tier[report.nodeid] = tier_of(report.keywords)

    def totals(self, key: str) -> dict[str, tuple[int, float]]:
        """(tests, seconds) per tier (`key="tier"`) or per folder under tests/ (`key="folder"`)."""
        out: dict[str, tuple[int, float]] = {}
        for nodeid, s in self.seconds.items():
            name = self.tier[nodeid] if key == "tier" else _folder(nodeid)
            n, t = out.get(name, (0, 0.0))
            out[name] = (n + 1, t + s)
        return out

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        tr = terminalreporter
        tr.section("time per tier (setup + call + teardown; budgets are recorded, not asserted)")
        for name, (n, s) in sorted(self.totals("tier").items()):
            budget = BUDGET_S.get(name)
            note = f" of a {budget:.0f} s budget ({s / budget:.0%})" if budget else ""
            tr.write_line(f"{name:>6}: {s:8.1f} s in {n} tests{note}")
        tr.write_line("per folder: " + ", ".join(f"{name} {s:.0f} s ({n})" for name, (n, s) in
                                                  sorted(self.totals("folder").items(), key=lambda kv: -kv[1][1])))


def _folder(nodeid: str) -> str:
    """The folder under tests/ of a test id (`engine` for a test of tests/engine/); `tests` for a file in tests/."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 else "tests"
