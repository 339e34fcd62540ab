"""The benchmark harness: its timing rule, its baselines' correctness (each baseline must compute the same rows
as the plain forward, or its ratio would be meaningless) and one small end-to-end run of `python -m bench` on a
tiny model. Speed itself is never asserted here: figures come from `python -m bench run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.__main__ import _TOOLS
from bench.lib import baselines
from bench.lib.harness import Side, Timings, alternate, percentile
from bench.lib.mfu import forward_flops
from bench.lib.report import Goal, Row
from tests.helpers.engine import rand_ids
from tests.helpers.reference import hf_model


def test_alternate_order_warmup_and_prepare() -> None:
    calls: list[str] = []
    prepared: list[str] = []
    sides = {"a": Side(lambda: calls.append("a") or "A", lambda: prepared.append("a")),
             "b": Side(lambda: calls.append("b") or "B")}
    t = alternate(sides, 3, "test")
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then forward / reversed / forward
    assert prepared == ["a"] * 4  # before every call of its side, the warm-up included
    assert len(t.seconds["a"]) == 3 and len(t.seconds["b"]) == 3
    assert t.warmup == {"a": "A", "b": "B"}


def test_timings_median_rate_and_noise() -> None:
    t = Timings(seconds={"x": [1.0, 3.0, 2.0], "y": [2.0, 2.1, 2.0]})
    assert t.median("x") == 2.0 and t.rate("x", 10) == 5.0
    assert "x" in t.noise("x", "y") and t.noise("y") == ""
    assert t.summary()["x"] == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert percentile([5, 1, 3, 2, 4], 0.5) == 3 and percentile([1, 2, 3], 1.0) == 3


def test_goals_and_ratios() -> None:
    faster = Row("w", "m", "tok/s", 150.0, "base", 100.0, Goal(">=", 1.5))
    assert faster.ratio == pytest.approx(1.5) and faster.met is True
    memory = Row("w", "m", "MB", 300.0, "base", 1000.0, Goal("<=", 0.25))
    assert memory.met is False
    mfu = Row("w", "m", "%", 71.0, "base", 60.0, Goal(">=", 70, "value"))
    assert mfu.met is True  # a goal on the value itself, not the ratio


def test_padded_batches_respect_the_budget() -> None:
    lengths = [5, 100, 30, 64, 64, 7, 200]
    batches = baselines.padded_batches(lengths, 256)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 256


def test_baselines_compute_the_plain_forward_rows(tiny_models) -> None:  # noqa: ANN001
    model = hf_model(str(tiny_models["llama"]))
    prompts = [rand_ids(n, seed=n) for n in (9, 40, 23, 64)]
    starts = [0, 17, 5, 62]
    plain = baselines.score_each(model, prompts, starts)
    assert [len(r) for r in plain] == [len(p) - 1 - s for p, s in zip(prompts, starts, strict=True)]
    padded = baselines.score_padded(model, prompts, starts, token_budget=128, pad_id=1)
    for a, b in zip(plain, padded, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-4)
    context, endings = rand_ids(30, seed=3), [rand_ids(n, seed=10 + n) for n in (3, 8, 5)]
    shared = baselines.score_shared_context(model, context, endings, pad_id=1)
    each = baselines.score_each(model, [context + e for e in endings], [len(context) - 1] * len(endings))
    for a, b in zip(each, shared, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-4)
    tokens = baselines.generate_padded(model, prompts[:2], 5, pad_id=1)
    assert [len(t) for t in tokens] == [5, 5]


def test_forward_flops(tiny_models) -> None:  # noqa: ANN001
    model = hf_model(str(tiny_models["llama"]))
    cfg = model.config
    params_only = forward_flops(model, 100, 99, attention=False)
    layer_w = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert params_only == 2 * layer_w * 100 + 2 * cfg.vocab_size * cfg.hidden_size * 99
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    attention = cfg.num_hidden_layers * cfg.num_attention_heads * 4 * head_dim * 100 * 101 / 2
    assert forward_flops(model, 100, 99) == pytest.approx(params_only + attention)


@pytest.mark.timeout(600)
def test_bench_smoke_run(tiny_models, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    from bench.__main__ import main

    main(["run", "--smoke", "-w", "short", "-w", "mc", "-w", "gen", "--no-llamacpp", "--reps", "1",
          "--model", str(tiny_models["llama"]), "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "2 short scoring" in printed and "3 multiple choice" in printed and "4 generation" in printed
    [js] = list(tmp_path.glob("*.json"))
    assert js.with_suffix(".md").is_file()
    result = json.loads(js.read_text())
    rows = result["rows"]
    assert not [r for r in rows if r["measure"] == "FAILED"], rows
    ratios = [r for r in rows if r.get("ratio") is not None]
    assert len(ratios) >= 4 and all(r["ratio"] > 0 for r in ratios)
    diffs = [r["rayscore"] for r in rows if r["measure"].startswith("max |logprob")]
    assert len(diffs) == 2 and all(d < 1e-4 for d in diffs)  # the engine's rows equal transformers' in the run
    # Where the CPU runs bfloat16 natively, workloads 2 and 4 add the bfloat16 engine (a real one) for information.
    from bench.lib.rayscore_side import native_bf16

    bf16 = [r for r in rows if "bf16" in r["measure"]]
    if native_bf16():
        assert {r["workload"] for r in bf16} == {"2 short scoring", "4 generation"}, bf16
        assert all(r["ratio"] > 0 for r in bf16 if r.get("ratio") is not None)
        assert result["details"]["short"]["bf16"]["max_abs_diff"] < 1.0  # bfloat16 rounding, not garbage
    else:
        assert not bf16


def test_cpu_name_names_the_instruction_sets() -> None:
    from bench.lib.report import ISA_FLAGS, cpu_name

    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), [])
    name = cpu_name()
    assert all((f in name) == (f in flags) for f in ISA_FLAGS), name


def test_llamacpp_probe_reports_a_crash_instead_of_taking_the_bench_down(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A child that dies the way a bad llama.cpp build did (SIGSEGV in its first decode): the probe names it.
    monkeypatch.setattr(baselines, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert baselines.llamacpp_probe(tmp_path / "m.gguf") == "a 16-token probe was killed by signal 11 (SIGSEGV)"
    monkeypatch.setattr(baselines, "_PROBE", "raise SystemExit('no such model')")
    assert baselines.llamacpp_probe(tmp_path / "m.gguf") == "a 16-token probe failed: no such model"
    monkeypatch.setattr(baselines, "_PROBE", "import sys; assert sys.argv[1].endswith('m.gguf')")
    assert baselines.llamacpp_probe(tmp_path / "m.gguf") is None


@pytest.mark.parametrize("tool", sorted(_TOOLS))
def test_every_tool_answers_help(tool: str, capsys: pytest.CaptureFixture[str]) -> None:
    # `python -m bench <tool>` hands the tool its arguments: each main takes them (and the tools that moved to
    # checks/ are found where they now live).
    from bench.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main([tool, "--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out
