"""`python -m bench cuda_check`, the script prepared for a lent GPU, on its CPU path (tiny shapes, seconds): every
section runs and reports, so the one try on a GPU is not lost to a script that rotted. Speed is never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.device.cuda_check import main


@pytest.mark.timeout(300)
def test_cuda_check_cpu_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--cpu-smoke", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cuda_check.json").read_text())
    assert set(res) == {"env", "exact", "bf16", "invariant"}
    assert all("error" not in r and "skipped" not in r for r in res.values()), res
    assert res["env"]["engine_imports"] == "ok"
    for family in ("llama", "qwen2"):
        r = res["exact"][family]
        for case in ("one_step", "warm_repeat", "chunked"):
            assert r[case]["max_abs_diff"] <= 1e-4 and r[case]["top_max_abs_diff"] <= 1e-4
            assert r[case]["top_sets_moved"] == 0
        assert r["warm_repeat"]["cached_tokens"] > 0  # the repeat was served from the prefix cache
        assert r["greedy"]["equal"] == r["greedy"]["prompts"] == 3
    bf16 = res["bf16"]
    assert bf16["rayscore_tok_s"] > 0 and bf16["transformers_tok_s"] > 0 and bf16["peak_bf16_tflops"] > 0
    assert bf16["max_abs_diff"] < 0.5  # bfloat16 both sides: close, not exact
    assert res["invariant"]["float32 invariant"]["moved"] == []
    out = capsys.readouterr().out
    table = out[out.index("cuda_check on cpu"):]
    assert "exact | float32 llama" in table and "PASS" in table and "bf16 | Llama-3-8B-shaped" in table


def test_cuda_check_skips_sections_past_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--cpu-smoke", "--budget-s", "0", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cuda_check.json").read_text())
    assert res["env"]["engine_imports"] == "ok"  # always runs
    for name in ("exact", "bf16", "invariant"):
        assert "--budget-s" in res[name]["skipped"]
    assert "bf16 | skipped" in capsys.readouterr().out
