"""Workload 5 behind both front doors (bench/workloads/http_doors.py), without Ray: a child's rows read back as they
were, each front door's rows marked, HAProxy's throughput over the Python proxy's on every shared measure, and the
child command carrying the run's settings."""

from __future__ import annotations

import json

from bench.lib.harness import Settings
from bench.lib.report import Goal, Row
from bench.workloads import http_doors


def _rows(rps: float) -> list[Row]:
    return [Row("5 over HTTP, short requests", "requests/s, 16 clients", "req/s", rps, "in-process", 10.0,
                Goal(">=", 0.92), "noise"),
            Row("5 over HTTP, short requests", "CPU-ms per request, serving processes", "ms", 20.0, "in-process", 90.0)]


def test_a_row_reads_back_as_written() -> None:
    for row in _rows(9.0):
        assert Row.from_json(json.loads(json.dumps(row.to_json()))) == row


def test_both_doors_are_marked_and_compared() -> None:
    rows = http_doors.combine({"python": _rows(8.0), "haproxy": _rows(9.0)})
    measures = [r.measure for r in rows]
    assert "Python proxy: requests/s, 16 clients" in measures and "HAProxy: requests/s, 16 clients" in measures
    [cross] = [r for r in rows if r.measure.startswith("HAProxy over the Python proxy")]
    assert cross.unit == "req/s" and cross.ratio == 9.0 / 8.0 and cross.baseline_name == "Python proxy"
    hap = next(r for r in rows if r.measure == "HAProxy: requests/s, 16 clients")
    assert hap.ratio == 0.9 and hap.goal == Goal(">=", 0.92) and hap.met is False  # against its own in-process
    # One side failed: the other's rows stand alone, no comparison.
    failed = Row(http_doors.NAME, "FAILED (HAProxy)", "", None)
    assert not [r for r in http_doors.combine({"python": _rows(8.0), "haproxy": [failed]})
                if r.measure.startswith("HAProxy over")]


def test_the_child_runs_one_door_with_the_runs_settings() -> None:
    class Ctx:
        settings = Settings(model="m", mode="quick", reps=2, threads=1, use_llamacpp=False, http_concurrency=8,
                            slow_side_budget_s=20.0, http_part="short", front_door="both")

    cmd = http_doors.child_command(Ctx(), "haproxy", "/tmp/o")  # type: ignore[arg-type]
    joined = " ".join(cmd)
    assert "-m bench run -w http --front-door haproxy --quick --model m --reps 2 --threads 1" in joined
    assert "--http-part short" in joined and cmd[-2:] == ["--out", "/tmp/o"]
