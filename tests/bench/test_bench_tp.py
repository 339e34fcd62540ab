"""`python -m bench tp --smoke`: one and two ranks, and two pipeline stages (one step at a time, then two in flight),
run the same prompts, rows agree, and the vocab-parallel log-softmax moves 3 floats per row (12 bytes) against a
gather's vocab / N floats (speed is never asserted)."""

from __future__ import annotations

import pytest

from bench.features.tp import main


def test_tp_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--smoke", "--sizes", "1", "2", "1x2"])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| 1 ", "| 2 ", "| 1x2 "))]
    assert [r[0] for r in rows] == ["1", "2", "1x2 seq", "1x2"]
    for stages in rows[2:]:
        assert float(stages[5]) <= 1e-4  # two pipeline stages, with and without overlap: the same rows
    assert [int(r[10]) for r in rows] == [1, 1, 1, 2]  # steps in flight at once: two with overlap
    two = rows[1]
    assert float(two[1]) > 0 and float(two[3]) > 0
    assert float(two[5]) <= 1e-4  # max |row - N=1|
    assert float(two[6]) == 12  # max, sum of exponentials, target: one float32 each
    assert float(two[7]) == 12 + 5 * (4 + 8)  # and 5 (value, id) candidates with top-5
    assert float(two[8]) == 1536 / 2 * 4  # a gather: this rank's half of the smoke vocabulary
