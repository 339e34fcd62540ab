"""head_dtype float32 on bfloat16 and float16 checkpoints: every path that makes logits (scoring chunks with top-k,
cached rows by the log-sum-exp shortcut, sampling, tensor-parallel vocabulary shards, a classifier's score head)
equals transformers with the head upcast as vLLM and SGLang upcast it: the final norm in the model dtype, then
F.linear(norm_output.float(), head_weight.float()), the soft-cap and log-softmax in float32. The same engine with
head_dtype model equals transformers' own half-precision head, and the two references are further apart than the
tolerance, so neither check passes when the setting is ignored."""

from __future__ import annotations

from functools import lru_cache, partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.loading.weight_update import apply_weights, stage_weights
from engine.parallel.local import run_local
from protocol.sampling import PoolingParams, SamplingParams
from rulebook.pooling import pooled_position
from tests.helpers.engine import greedy, make_engine, rand_ids, scoring
from tests.helpers.tiny_classifiers import build_classifier
from tests.helpers.tiny_families import build_family
from tests.helpers.tiny_models import build_tiny_model

ATOL = 1e-4
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _halve(folder: Path, cls: type = AutoModelForCausalLM) -> Path:
    """The checkpoint rewritten in bfloat16, as RL teachers are stored."""
    cls.from_pretrained(folder, dtype=torch.float32).to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def half(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("half")
    return {"llama": _halve(build_tiny_model(root / "llama", "llama")),
            "llama-tied": _halve(build_tiny_model(root / "tied", "llama", tie=True, seed=1)),
            "gemma2": _halve(build_family(root / "gemma2", "gemma2", seed=2))}  # final soft-cap, tied


class UpcastHead(nn.Module):
    """transformers' lm_head as vLLM's head_dtype float32 runs it: the final norm's output and the weight upcast."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.head.weight.float())


@lru_cache(maxsize=8)
def _hf(path: str, dtype: str, float32_head: bool) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).eval()
    if float32_head:
        model.lm_head = UpcastHead(model.lm_head)
    return model


@torch.inference_mode()
def reference(path: Path, ids: list[int], dtype: str, float32_head: bool) -> torch.Tensor:
    """[L, V] float32 log-softmax of transformers' logits (its soft-cap after the head, in the head's dtype)."""
    return torch.log_softmax(_hf(str(path), dtype, float32_head)(torch.tensor([ids])).logits[0].float(), dim=-1)


def _rows(lp: torch.Tensor, ids: list[int], start: int) -> torch.Tensor:
    return lp[torch.arange(start, len(ids) - 1), torch.tensor(ids[start + 1:])]


def _check_rows(got: list, lp: torch.Tensor, ids: list[int], start: int) -> float:
    assert [t for _, t in got] == ids[start + 1:]
    return (torch.tensor([v for v, _ in got]) - _rows(lp, ids, start)).abs().max().item()


@pytest.mark.parametrize(("name", "dtype"), [("llama", "bfloat16"), ("llama-tied", "bfloat16"),
                                             ("llama", "float16"), ("gemma2", "bfloat16")])
def test_scoring_equals_transformers_with_the_head_upcast(half: dict[str, Path], name: str, dtype: str) -> None:
    path = half[name]
    prompts = [rand_ids(37, 1), rand_ids(23, 2)]
    upcast = make_engine(path, dtype=dtype, head_dtype="float32")
    own = make_engine(path, dtype=dtype)
    got = upcast.generate(prompts, [scoring(0, k=5), scoring(4)], check=True)
    plain = own.generate(prompts, [scoring(0, k=5), scoring(4)], check=True)
    apart = 0.0
    for ids, start, out, base in zip(prompts, (0, 4), got, plain, strict=True):
        want, half_head = reference(path, ids, dtype, True), reference(path, ids, dtype, False)
        apart = max(apart, (_rows(want, ids, start) - _rows(half_head, ids, start)).abs().max().item())
        assert _check_rows(out.input_token_logprobs, want, ids, start) <= ATOL
        assert _check_rows(base.input_token_logprobs, half_head, ids, start) <= ATOL
        for pos, top in enumerate(out.input_top_logprobs or [], start=start):
            ref_v, ref_i = torch.topk(want[pos], 5)
            assert [i for _, i in top] == ref_i.tolist()
            assert max(abs(v - r) for (v, _), r in zip(top, ref_v.tolist(), strict=True)) <= ATOL
    assert apart > 2 * ATOL  # the setting matters on these weights: the two heads are further apart than ATOL
    # The embedding a tied head shares stays in the model dtype: the upcast is per call, never in place.
    assert upcast.model.model.embed_tokens.weight.dtype == DTYPES[dtype]
    assert upcast.model.lm_head.weight.dtype == DTYPES[dtype]


def test_cached_rows_by_the_shortcut_and_token_ids(half: dict[str, Path]) -> None:
    """A second score of the same prompt reads its rows from the prefix cache: targets and token ids are single
    dot products minus the stored log-sum-exp, which the upcast head must give as the full projection does."""
    path = half["llama"]
    ids = rand_ids(33, 5)
    eng = make_engine(path, dtype="bfloat16", head_dtype="float32", enable_prefix_cache=True)
    asked = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0, token_ids_logprob=[3, 40, 200])
    want = reference(path, ids, "bfloat16", True)
    for round_ in range(2):
        out = eng.generate([ids], [asked], check=True)[0]
        assert _check_rows(out.input_token_logprobs, want, ids, 0) <= ATOL
        for pos, row in enumerate(out.input_token_ids_logprobs or []):
            assert max(abs(v - want[pos, t].item()) for v, t in row) <= ATOL
        if round_:
            assert out.cached_tokens >= 32
    assert eng.stats().prefix_cache_hit_tokens > 0


def test_a_weight_update_is_projected_at_once(half: dict[str, Path], tmp_path: Path) -> None:
    """No float32 copy of the head is kept, so none goes stale: after an update the upcast head is the new one
    (tied: the new embedding)."""
    path = half["llama-tied"]
    second = _halve(build_tiny_model(tmp_path / "second", "llama", tie=True, seed=5))
    eng = make_engine(path, dtype="bfloat16", head_dtype="float32", enable_prefix_cache=True)
    ids = rand_ids(21, 6)
    eng.generate([ids], [scoring(0)], check=True)
    apply_weights(eng, stage_weights(eng, str(second)), "v2")
    out = eng.generate([ids], [scoring(0)], check=True)[0]
    assert _check_rows(out.input_token_logprobs, reference(second, ids, "bfloat16", True), ids, 0) <= ATOL


@pytest.mark.parametrize(("name", "dtype"), [("gemma2", "bfloat16"), ("llama", "float16")])
def test_sampling_rows_use_the_upcast_head(half: dict[str, Path], name: str, dtype: str) -> None:
    """prime-rl's teacher call, max_tokens 1: the sampled token and its logprobs come from the sampler's rows (the
    prompts' last, computed by the prefill as the scoring rows are). Later tokens decode one row at a time, whose
    half-precision attention rounds unlike transformers' (its bits, not the head's, are then compared)."""
    path = half[name]
    prompts = [rand_ids(9, 7), rand_ids(20, 8), rand_ids(31, 9)]
    outs = make_engine(path, dtype=dtype, head_dtype="float32").generate(prompts, greedy(1, k=3), check=True)
    for ids, out in zip(prompts, outs, strict=True):
        lp = reference(path, ids, dtype, True)[-1]
        ((v, t),), (top,) = out.output_token_logprobs, out.output_top_logprobs
        assert out.new_token_ids == [t] == [int(lp.argmax())]  # greedy by the float32 logits
        assert abs(v - lp[t].item()) <= ATOL
        assert [i for _, i in top] == torch.topk(lp, 3).indices.tolist()
        assert max(abs(a - lp[i].item()) for a, i in top) <= ATOL


def _split_head(path: str, eng: LLMEngine) -> tuple[torch.Tensor, list, list, torch.Tensor]:
    """Rank 0's job: the vocabulary-parallel head over fixed rows, by its three phases (sampling logits, scoring
    blocks with top-k, the shortcut's single logits)."""
    assert eng.parallel is not None
    hidden = _rows_in(eng.model.hidden_size)
    targets = torch.arange(len(hidden)) * 37 % eng.vocab_size
    logits = eng.parallel.compute_logits(hidden)
    got = eng.parallel.score_rows(hidden, eng.model.compute_logits, targets, [3] * len(hidden), "raw_logprobs", 4)
    return logits, got.values, got.tops, eng.parallel.target_logits(hidden, targets)


def _rows_in(width: int) -> torch.Tensor:
    return (torch.randn(10, width, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)


@torch.inference_mode()
def test_tensor_parallel_vocab_shards_upcast_each_share(half: dict[str, Path]) -> None:
    """Each rank upcasts its share of the head. (The rows are given: a split body sums its bfloat16 partial
    products across ranks in another order than one device, so whole-model rows are not transformers' bits.)"""
    path = half["llama"]
    cfg = EngineConfig(model=str(path), dtype="bfloat16", head_dtype="float32", num_kv_blocks=16)
    (logits, values, tops, picked), _ = run_local(2, cfg, partial(_split_head, str(path)), timeout_s=240)
    whole = _hf(str(path), "bfloat16", True)
    hidden = _rows_in(logits.shape[0] and whole.config.hidden_size)
    want = whole.lm_head(whole.model.norm(hidden))  # [10, V] float32
    targets = torch.arange(len(hidden)) * 37 % want.shape[1]
    assert (want - whole.lm_head.head(whole.model.norm(hidden)).float()).abs().max() > 2 * ATOL  # it matters
    torch.testing.assert_close(logits, want, rtol=0, atol=ATOL)
    torch.testing.assert_close(picked, want.gather(1, targets[:, None])[:, 0], rtol=0, atol=ATOL)
    lp = torch.log_softmax(want, -1)
    assert max(abs(v - lp[r, t].item()) for r, (v, t) in enumerate(values)) <= ATOL
    assert [[i for _, i in top] for top in tops] == torch.topk(lp, 3).indices.tolist()


@torch.inference_mode()
def test_classifier_score_head_upcast(tmp_path: Path) -> None:
    path = _halve(build_classifier(tmp_path / "cls", "llama", 3, seed=3), AutoModelForSequenceClassification)
    ref = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.bfloat16).eval()
    prompts = [rand_ids(n, seed=n) for n in (5, 17)]
    outs = make_engine(path, dtype="bfloat16", head_dtype="float32").generate(
        prompts, SamplingParams(max_tokens=0, pooling=PoolingParams()), check=True)
    for ids, out in zip(prompts, outs, strict=True):
        normed = ref.model(torch.tensor([ids])).last_hidden_state[0, pooled_position(ids, ref.config.pad_token_id)]
        want = F.linear(normed.float(), ref.score.weight.float())
        own = ref.score(normed).float()
        assert (want - own).abs().max() > 2 * ATOL
        assert max(abs(g - w) for g, w in zip(out.pooled or [], want.tolist(), strict=True)) <= ATOL


def test_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="head_dtype must be model or float32"):
        EngineConfig(head_dtype="float16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="head_dtype float32 is not available with batch_invariant"):
        EngineConfig(dtype="bfloat16", head_dtype="float32", batch_invariant=True)
    assert not EngineConfig(head_dtype="float32").float32_head  # a float32 model's head is float32 already
    assert EngineConfig(dtype="float16", head_dtype="float32").float32_head
