"""`python -m bench score_memory --smoke`: the tool runs, and its table shows the engine's chunk within the bound
and under the former form's bytes per logit, with the same values (speed is never asserted)."""

from __future__ import annotations

import pytest

from bench.features.score_memory import main


def test_score_memory_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--smoke"])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| float32 ", "| bfloat16 "))]
    assert [(r[0], r[1]) for r in rows] == [("float32", "plain"), ("float32", "all"), ("bfloat16", "plain"),
                                            ("bfloat16", "all")]
    for r in rows:
        former, engine, bound, diff = float(r[2]), float(r[3]), float(r[4]), float(r[6])
        assert 4 <= engine <= bound < former and diff <= 1e-6
