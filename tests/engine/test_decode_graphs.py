"""Decode steps through the CUDA-graph runner's buckets (engine/runner/decode_graphs.py). On CPU nothing is
captured, but the same static buffers, padding rows and scratch block run eagerly: padding a decode batch to its
bucket must leave every real row's values and tokens as they are without it, and as transformers'."""

from __future__ import annotations

import pytest
import torch

from engine.llm_engine import LLMEngine
from engine.runner.decode_graphs import DecodeGraphs, decode_buckets
from tests.helpers.engine import greedy, make_engine, rand_ids
from tests.helpers.families import hf_generate
from tests.helpers.reference import hf_model


def test_buckets_cover_every_batch_size() -> None:
    for most in (1, 5, 64, 100, 256, 300):
        got = decode_buckets(most)
        assert got == sorted(set(got)) and got[0] == 1 and got[-1] == most
        for n in range(1, most + 1):
            b = next(b for b in got if b >= n)
            assert b - n <= max(7, n // 4), (most, n, b)  # padding stays a small share
    assert decode_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def _with_graphs(eng: LLMEngine) -> list[int]:
    """Turn the eager bucket runner on; returns the list that records each bucket a step ran in."""
    graphs = eng.runner.decode_graphs(eng.kv.pool.num_blocks, eng.max_model_len, capture=False)
    assert isinstance(graphs, DecodeGraphs)
    used: list[int] = []
    run = graphs.run

    def recording(ids: torch.Tensor, pos: torch.Tensor, meta) -> torch.Tensor:  # noqa: ANN001
        used.append(graphs.bucket(len(meta.lens)))
        return run(ids, pos, meta)

    graphs.run = recording  # type: ignore[method-assign]
    eng.runner.graphs = graphs
    return used


@pytest.mark.parametrize(("family", "kernel"), [
    ("llama", "reference"), ("qwen2", "reference"),
    ("llama", "triton")])
def test_padded_decode_equals_unpadded_and_transformers(tiny_models, family: str, kernel: str) -> None:
    path = tiny_models[family]
    prompts = [rand_ids(n, seed=50 + n) for n in (3, 11, 26)]  # three requests: bucket 4, one padding row
    params = greedy(10, k=3)
    plain = make_engine(path, attention_backend="varlen", max_num_seqs=8).generate(prompts, params, check=True)
    eng = make_engine(path, attention_backend="varlen", max_num_seqs=8)
    if kernel == "triton":  # the static buffers (fixed table width, scratch block) through our kernel
        from engine.layers.varlen_triton import varlen_attention_triton
        from tests.helpers.triton_device import kernel_device

        kernel_device()
        eng.runner.backend.kernel = varlen_attention_triton
    used = _with_graphs(eng)
    padded = eng.generate(prompts, params, check=True)
    assert 4 in used and all(b in decode_buckets(8) for b in used)
    ref = hf_model(str(path))
    for ids, a, b in zip(prompts, plain, padded, strict=True):
        assert a.new_token_ids == b.new_token_ids
        assert max(abs(x - y) for (x, _), (y, _) in zip(a.output_token_logprobs, b.output_token_logprobs,
                                                        strict=True)) < 1e-5
        with torch.inference_mode():
            g = hf_generate(ref, ids, 10)
        assert b.new_token_ids == g.sequences[0, len(ids):].tolist()
        for (v, t), step in zip(b.output_token_logprobs, g.logits, strict=True):
            assert abs(v - torch.log_softmax(step[0].float(), -1)[t].item()) <= 1e-4
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks  # the scratch block is outside the pool


def test_steps_that_do_not_fit_run_without_the_buckets(tiny_models) -> None:
    """Prefill steps, and decodes beyond the largest bucket, take the plain forward."""
    eng = make_engine(tiny_models["llama"], attention_backend="varlen", max_num_seqs=3)
    used = _with_graphs(eng)
    prompts = [rand_ids(n, seed=n) for n in (4, 9, 7, 12, 5)]  # more requests than max_num_seqs: staggered
    outs = eng.generate(prompts, greedy(4), check=True)
    alone = [make_engine(tiny_models["llama"]).generate([p], greedy(4))[0] for p in prompts]
    assert [o.new_token_ids for o in outs] == [a.new_token_ids for a in alone]
    assert used and max(used) <= 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: graph capture")
def test_cuda_graphs_same_tokens_as_eager(tiny_models) -> None:
    """On a GPU a CUDA varlen kernel must serve (flash with the pages it takes, else Triton) and the graphs must
    capture: a probe or capture failure fails here rather than skipping."""
    from engine.layers.attention import VarlenPagedAttention
    from engine.layers.varlen import varlen_attention_reference
    from engine.runner.attention_choice import pick_block_size

    path = tiny_models["llama"]
    prompts = [rand_ids(n, seed=n) for n in (3, 11, 26)]
    block_size, kernels = pick_block_size(torch.device("cuda"), torch.bfloat16, 16, False)
    cfg = dict(device="cuda", dtype="bfloat16", block_size=block_size, attention_backend="auto", max_num_seqs=8)
    eager = make_engine(path, cuda_graphs=False, **cfg)
    graphed = make_engine(path, cuda_graphs=True, **cfg)
    backend = graphed.runner.backend
    assert isinstance(backend, VarlenPagedAttention) and backend.kernel is not varlen_attention_reference, kernels
    assert graphed.runner.graphs is not None, "decode CUDA graphs failed to capture (see the engine's log)"
    assert graphed.runner.graphs.graphs and eager.runner.graphs is None
    a = eager.generate(prompts, greedy(8))
    b = graphed.generate(prompts, greedy(8))
    assert [o.new_token_ids for o in a] == [o.new_token_ids for o in b]
