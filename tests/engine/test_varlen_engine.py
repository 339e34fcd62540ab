"""The engine with attention_backend=varlen (one attention call per layer per step, the reference kernel on CPU)
through the checks the torch path passes against transformers: any chunking, mixed batches, prefix hits past the
window with the hidden-state store on and off, batched greedy decode; sliding windows, Gemma 2's soft-cap, GQA."""

from __future__ import annotations

import pytest

from engine.layers.attention import TorchPagedAttention, VarlenPagedAttention
from tests.helpers import engine as engine_helpers
from tests.helpers.engine import assert_rows, make_engine, rand_ids, scoring
from tests.helpers.families import (
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    family_path,
)
from tests.helpers.reference import hf_scores
from tests.helpers.triton_device import kernel_device

# GQA in all; windows: qwen2-window, mistral, gemma3 (mixed local/global); soft-cap and windows: gemma2.
FAMILIES = ["qwen2-window", "mistral", "gemma2", "gemma3"]


@pytest.fixture(autouse=True)
def _varlen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(engine_helpers.DEFAULTS, "attention_backend", "varlen")


def test_config_picks_the_backend(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"])
    assert isinstance(eng.runner.backend, VarlenPagedAttention)
    assert isinstance(make_engine(tiny_models["llama"], attention_backend="auto").runner.backend, TorchPagedAttention)
    assert isinstance(make_engine(tiny_models["llama"], attention_backend="torch").runner.backend,
                      TorchPagedAttention)


@pytest.mark.parametrize("budget", [1, 5, 1000])
def test_scoring_any_chunking_llama(tiny_models, budget: int) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path, max_num_batched_tokens=budget)
    ids = rand_ids(37, seed=budget)
    for start in (0, 17, len(ids) - 2):
        out = eng.generate([ids], scoring(start), check=True)[0]
        assert_rows(out.input_token_logprobs, ids, start, hf_scores(path, ids, start))


@pytest.mark.parametrize("family", FAMILIES)
def test_scoring_any_chunking(family: str) -> None:
    check_scoring_any_chunking(family_path(family), budgets=(3, 16))


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_batch(family: str) -> None:
    check_mixed_batch(family_path(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_cache_and_hidden_store(family: str) -> None:
    check_prefix_cache(family_path(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_generate(family: str) -> None:
    check_greedy(family_path(family))


def test_triton_kernel_in_the_engine() -> None:
    """Gemma 2 (soft-cap, windows, GQA) on our Triton kernel, float32: chunked scoring and batched greedy decode
    within 1e-4 of transformers (on CPU through Triton's interpreter)."""
    from engine.layers.varlen_triton import varlen_attention_triton
    from tests.helpers.engine import greedy
    from tests.helpers.families import hf_generate
    from tests.helpers.reference import hf_model

    kernel_device()
    path = family_path("gemma2")
    eng = make_engine(path, max_num_batched_tokens=16)
    eng.runner.backend.kernel = varlen_attention_triton
    ids = rand_ids(37, seed=4)
    out = eng.generate([ids], scoring(0), check=True)[0]
    assert_rows(out.input_token_logprobs, ids, 0, hf_scores(path, ids, 0))
    prompts = [rand_ids(n, seed=100 + n) for n in (3, 11)]
    outs = eng.generate(prompts, greedy(5), check=True)
    ref = hf_model(str(path))
    for p, o in zip(prompts, outs, strict=True):
        assert o.new_token_ids == hf_generate(ref, p, 5).sequences[0, len(p):].tolist()


def test_triton_kernel_whole_model_float16_against_the_torch_path(tiny_models) -> None:
    """One whole-model pass in float16 (the dtype the Triton kernel serves in) with pages of 16: chunked scoring of
    two prompts, one of them past 16 new tokens a step (the prefill tile), and batched greedy decode, through the
    Triton backend against the torch path in float16 on the same weights."""
    from engine.layers.varlen_triton import varlen_attention_triton
    from tests.helpers.engine import greedy

    kernel_device()
    path = tiny_models["llama"]
    cfg = dict(dtype="float16", block_size=16, max_num_batched_tokens=48)
    tri = make_engine(path, **cfg)
    tri.runner.backend.kernel = varlen_attention_triton
    torch_path = make_engine(path, attention_backend="torch", **cfg)
    prompts = [rand_ids(70, seed=7), rand_ids(23, seed=8)]
    a = tri.generate(prompts, scoring(0), check=True)
    b = torch_path.generate(prompts, scoring(0), check=True)
    for x, y in zip(a, b, strict=True):
        assert len(x.input_token_logprobs) == len(y.input_token_logprobs) > 20
        diffs = [abs(u - v) for (u, _), (v, _) in zip(x.input_token_logprobs[1:], y.input_token_logprobs[1:],
                                                      strict=True)]
        assert max(diffs) < 2e-2, max(diffs)  # float16 both sides: close, not exact
    ga = tri.generate(prompts, greedy(6), check=True)
    gb = torch_path.generate(prompts, greedy(6), check=True)
    assert [o.new_token_ids for o in ga] == [o.new_token_ids for o in gb]
