"""`python -m bench cuda_check`, the script prepared for a lent GPU, on its CPU path (tiny shapes, seconds): every
section runs and reports, so the one try on a GPU is not lost to a script that rotted. Speed is never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.device.cuda_check import main


def _float32_cases_pass(r: dict, greedy: int) -> None:
    """bench/device/exact.py's float32_cases, as a section reports them: every row and top-k value within 1e-4, the
    warm repeats served from the prefix cache, the varlen backend on its reference kernel (float32 on CPU), greedy
    equal on every prompt."""
    for case in ("one_step", "warm_repeat", "chunked", "varlen", "varlen_warm"):
        assert r[case]["max_abs_diff"] <= 1e-4 and r[case]["top_max_abs_diff"] <= 1e-4, (case, r[case])
        assert r[case]["top_sets_moved"] == 0
    assert r["warm_repeat"]["cached_tokens"] > 0 and r["varlen_warm"]["cached_tokens"] > 0
    assert r["varlen"]["kernel"] == "varlen_attention_reference"
    assert r["greedy"]["equal"] == r["varlen_greedy"]["equal"] == greedy, (r["greedy"], r["varlen_greedy"])


@pytest.mark.timeout(420)  # a hang guard: the sections before gpt_oss alone took 280 s on 2 cores shared 8 ways
def test_cuda_check_cpu_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--cpu-smoke", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cuda_check.json").read_text())
    assert set(res) == {"env", "exact", "bf16", "ragged", "prefill", "mc", "generate", "invariant", "mla", "gpt_oss"}
    assert all("error" not in r and "skipped" not in r for r in res.values()), res
    assert res["env"]["engine_imports"] == "ok"
    for family in ("llama", "qwen2"):
        _float32_cases_pass(res["exact"][family], greedy=3)
    bf16 = res["bf16"]
    assert bf16["rayscore_tok_s"] > 0 and bf16["transformers_tok_s"] > 0 and bf16["peak_bf16_tflops"] > 0
    assert bf16["max_abs_diff"] < 0.5  # bfloat16 both sides: close, not exact
    assert res["invariant"]["float32 invariant"]["moved"] == []
    oss = res["gpt_oss"]
    _float32_cases_pass(oss, greedy=1)
    assert oss["bf16"]["max_abs_diff_vs_torch"] < 0.5 and oss["bf16"]["backend"] == "TorchPagedAttention"  # CPU
    # The workloads: both sides ran and agree (bfloat16 both sides: close, not exact), every figure is there.
    for name in ("ragged", "mc"):
        r = res[name]
        assert r["rayscore"]["tok_s"] > 0 and r["transformers"]["tok_s"] > 0 and r["max_abs_diff"] < 0.5
        assert r["rayscore"]["mfu_measured_peak"] > 0 and r["rayscore"]["mfu_spec"] > 0
    assert res["ragged"]["setup"]["kernel_16"] == [None, "no CUDA device"]
    assert res["prefill"]["scoring_over_prefill"] > 0
    for batch in ("batch_4", "batch_8"):
        g = res["generate"][batch]
        assert g["eager"]["decode_tok_s"] > 0 and g["transformers"]["out_tok_s"] > 0
        assert g["graphs"].startswith("off")  # no CUDA: nothing captured
        assert g["transformers"]["static_cache_gib"] > 0  # generate with disable_compile ran, warmed up first
    mla = res["mla"]  # the MLA model: exact on the torch path and the varlen reference, latent smaller than MHA
    _float32_cases_pass(mla, greedy=3)
    assert mla["latent_bytes_per_token_bf16"] < mla["mha_bytes_per_token_bf16"] and mla["bf16_score_tok_s"] > 0
    out = capsys.readouterr().out
    table = out[out.index("cuda_check on cpu"):]
    assert "exact | float32 llama" in table and "PASS" in table and "bf16 | Llama-3-8B-shaped" in table
    assert "ragged | ragged" in table and "mc | multiple choice" in table and "generate | generate batch 8" in table


def test_moe_section_on_request(tmp_path: Path) -> None:
    """Not in the default run (its 540 s are taken): `--section moe` runs it, on CPU the loop alone."""
    main(["--cpu-smoke", "--section", "moe", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cuda_check.json").read_text())
    assert res["moe"]["path_chosen"] == "loop" and res["moe"]["smoke_T16"]["loop_ms"] > 0


def test_hybrid_section_on_request(tmp_path: Path) -> None:
    """Not in the default run: `--section hybrid` runs the Qwen3.5 section; on CPU the float32 checks (the warm
    repeats resume from state snapshots) and bfloat16 on the torch reference, which says why."""
    main(["--cpu-smoke", "--section", "hybrid", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cuda_check.json").read_text())["hybrid"]
    assert "error" not in res, res
    _float32_cases_pass(res, greedy=1)
    b = res["bf16"]
    assert b["rule"] == "torch reference: no CUDA device (cpu)" and b["max_abs_diff_vs_fp32"] < 0.5
    assert b["prefill"]["tok_s"] > 0 and b["decode"]["tok_s"] > 0


def test_cuda_check_skips_sections_past_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--cpu-smoke", "--budget-s", "0", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "cuda_check.json").read_text())
    assert res["env"]["engine_imports"] == "ok"  # always runs
    for name in ("exact", "bf16", "ragged", "prefill", "mc", "generate", "invariant", "mla", "gpt_oss"):
        assert "--budget-s" in res[name]["skipped"]
    assert "bf16 | skipped" in capsys.readouterr().out


def test_plan_fits_one_device_call(capsys: pytest.CaptureFixture[str]) -> None:
    """--plan prints every section with its estimated seconds and GPU GiB and the total: at most 540 s on one
    H200 with start-up (a device call allows 600), and no section above an 80 GB card."""
    main(["--plan"])
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[0]: ln.split()[1:3] for ln in lines[1:]}
    assert set(rows) == {"start-up", "env", "exact", "bf16", "ragged", "prefill", "mc", "generate", "invariant",
                         "mla", "gpt_oss", "total"}
    seconds = [float(v[0]) for k, v in rows.items() if k != "total"]
    assert float(rows["total"][0]) == sum(seconds) <= 540
    assert all(float(v[1]) <= 78 for k, v in rows.items() if k not in ("start-up", "total"))
    main(["--plan", "--section", "env", "--section", "generate"])
    assert capsys.readouterr().out.splitlines()[-1].split()[1] == "115"  # 20 start-up + 5 + 90


def test_run_script_is_the_one_command(tmp_path: Path) -> None:
    """bench/device/run.sh, what a GPU run calls: it checks the python's packages and hands its arguments to
    cuda_check (here --plan, so nothing runs)."""
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OUT": str(tmp_path), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(root / "bench/device/run.sh"), "--plan"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("torch ") and "total" in done.stdout
    bad = subprocess.run(["bash", str(root / "bench/device/run.sh"), "--plan"], capture_output=True, text=True,
                         env={**env, "PYTHON": "/usr/bin/false"}, timeout=60, check=False)
    assert bad.returncode != 0
