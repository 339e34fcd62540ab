"""`python -m bench image_budget --smoke`: the tool runs all three sides per image size, each side's step stays within
its budget (or one image alone), and the rows agree with the unbudgeted side (time and memory are never asserted)."""

from __future__ import annotations

import pytest

from bench.features.image_budget import main


def test_image_budget_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--smoke", "--threads", "1"])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| 112² ", "| 224² "))]
    assert [(r[0], r[2]) for r in rows] == [(size, side) for size in ("112²", "224²")
                                            for side in ("off", "default", "one")]
    for r in rows:
        if r[2] == "one":
            budget, most = int(r[3].replace(",", "")), int(r[6].replace(",", ""))
            assert most == budget  # every image here is one image's size: one per step
            assert int(r[8]) > 1  # so the batch takes several steps
        assert float(r[12]) <= 1e-4
