"""Where the suite's time goes: a pytest plugin (tests/conftest.py registers it) that adds up each test's setup, call
and teardown by tier (`fast`: what `make test-fast` runs; `e2e`: the Ray tier) and by folder, and prints them beside
the tier's budget at the end of every run, so CI's output records them run after run.

`make test` runs the two tiers as two pytest sessions (the fast one on several processes, pytest-xdist); each session
also merges its tests' seconds and its wall time into one file (`SUITE_TIMES`, emptied by the Makefile first), and
`python -m tests.helpers.suite_times` then prints the whole suite's 30 slowest tests and its time per tier.

The budgets are recorded, never asserted: the same commit takes 1.6x longer on one 2-vCPU machine kind than on
another (docs/testing.md), and speed is measured in benchmarks, not failed in tests."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

import pytest

# Wall seconds per tier that keep `make test` under 25 minutes on the slowest 2-vCPU kind seen (docs/testing.md).
BUDGET_S = {"fast": 600.0, "e2e": 900.0}
# The file each pytest session of `make test` merges its times into (the Makefile removes it before the first).
SUITE_TIMES = Path(os.environ.get("RAYSCORE_SUITE_TIMES", ".pytest_cache/rayscore-suite-times.json"))
SLOWEST = 30


def tier_of(keywords: object) -> str:
    return "e2e" if "e2e" in keywords else "fast"  # type: ignore[operator]


class SuiteTimes:
    """Seconds per test (setup + call + teardown), its tier and its folder under tests/; the session's wall time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tier: dict[str, str] = {}
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        self.tier[report.nodeid] = tier_of(report.keywords)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
        if not self.seconds:
            return
        wall = time.monotonic() - self.started
        tests = {nodeid: (self.tier[nodeid], s) for nodeid, s in self.seconds.items()}
        workers = int(getattr(config.option, "numprocesses", 0) or 0)
        tiers = sorted(set(self.tier.values()))
        terminalreporter.section("time per tier (setup + call + teardown; budgets are recorded, not asserted)")
        _report(terminalreporter, tests, {"+".join(tiers): (wall, workers)}, slowest=0)
        if os.environ.get("PYTEST_XDIST_WORKER") is None:  # the controller (or a lone pytest) records the session
            _merge(tests, "+".join(tiers), wall, workers)


def _totals(tests: dict[str, tuple[str, float]], key: str) -> dict[str, tuple[int, float]]:
    """(tests, seconds) per tier (`key="tier"`) or per folder under tests/ (`key="folder"`)."""
    out: dict[str, tuple[int, float]] = {}
    for nodeid, (tier, s) in tests.items():
        name = tier if key == "tier" else _folder(nodeid)
        n, t = out.get(name, (0, 0.0))
        out[name] = (n + 1, t + s)
    return out


def _report(out: Any, tests: dict[str, tuple[str, float]], walls: dict[str, tuple[float, int]], slowest: int) -> None:
    """Seconds per tier (the sum of its tests, and its session's wall time where it ran in parallel) beside the
    tier's budget, seconds per folder, and the `slowest` tests."""
    for name, (n, s) in sorted(_totals(tests, "tier").items()):
        wall, workers = walls.get(name, (s, 0))
        budget = BUDGET_S.get(name)
        spent = wall if workers else s
        note = f" of a {budget:.0f} s budget ({spent / budget:.0%})" if budget else ""
        par = f", {wall:.1f} s wall on {workers} processes" if workers else ""
        out.write_line(f"{name:>6}: {s:8.1f} s in {n} tests{par}{note}")
    out.write_line("per folder: " + ", ".join(f"{name} {s:.0f} s ({n})" for name, (n, s) in
                                              sorted(_totals(tests, "folder").items(), key=lambda kv: -kv[1][1])))
    if slowest:
        out.write_line(f"the {slowest} slowest tests (setup + call + teardown):")
        for nodeid, (_, s) in sorted(tests.items(), key=lambda kv: -kv[1][1])[:slowest]:
            out.write_line(f"{s:8.1f} s  {nodeid}")


def _merge(tests: dict[str, tuple[str, float]], tiers: str, wall: float, workers: int) -> None:
    saved = _load()
    saved["tests"].update({nodeid: list(v) for nodeid, v in tests.items()})
    saved["walls"][tiers] = [wall, workers]
    SUITE_TIMES.parent.mkdir(parents=True, exist_ok=True)
    SUITE_TIMES.write_text(json.dumps(saved))


def _load() -> dict[str, Any]:
    if SUITE_TIMES.exists():
        return json.loads(SUITE_TIMES.read_text())
    return {"tests": {}, "walls": {}}


def _folder(nodeid: str) -> str:
    """The folder under tests/ of a test id (`engine` for a test of tests/engine/); `tests` for a file in tests/."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 else "tests"


class _Lines:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write_line(self, line: str) -> None:
        print(line, file=self.stream)


def main() -> None:
    """The whole suite's report from the sessions `make test` ran: its time per tier and its 30 slowest tests."""
    saved = _load()
    if not saved["tests"]:
        print(f"no test times in {SUITE_TIMES}")
        return
    tests = {nodeid: (tier, s) for nodeid, (tier, s) in saved["tests"].items()}
    walls = {tiers: (wall, workers) for tiers, (wall, workers) in saved["walls"].items()}
    total = sum(wall for wall, _ in walls.values())
    print(f"==== the whole suite: {total:.1f} s of pytest wall time in {len(walls)} sessions ====")
    _report(_Lines(sys.stdout), tests, walls, slowest=SLOWEST)


if __name__ == "__main__":
    main()
