"""`python -m bench families --smoke`: the tool builds both shapes, runs both sides and prints rows that agree with
transformers (speed is never asserted here)."""

from __future__ import annotations

import pytest

from bench.features.families import main


def test_families_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--smoke", "--threads", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| qwen3 ", "| moe "))]
    assert len(lines) == 2
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[2]) > 0 and float(cells[3]) > 0
        assert float(cells[5]) <= 1e-4  # max |rayscore - transformers|
