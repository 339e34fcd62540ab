"""`python -m bench head_dtype --smoke`: the tool runs, and its table shows the float32 head near the float64
projection of the same bfloat16 weights and the bfloat16 head far from it, with the float32 head's extra peak within
one upcast slice of the weight and the rows (speed is never asserted)."""

from __future__ import annotations

import pytest

from bench.features.head_dtype import main
from engine.layers.linear import UPCAST_ROWS

MIB = 2**20


def test_head_dtype_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--smoke"])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith(f"| {UPCAST_ROWS + 1000} x 32 ")]
    assert [r[1] for r in rows] == ["1", "16"]
    for r in rows:
        extra, bf16_err, fp32_err = float(r[7]), float(r[8]), float(r[9])
        assert fp32_err <= 1e-5 < 1e-3 <= bf16_err
        # One float32 slice of the head (UPCAST_ROWS x hidden) and the upcast rows, then the bf16 side's own.
        assert extra <= (UPCAST_ROWS * 32 * 4 + int(r[1]) * 32 * 4) / MIB + 0.5
