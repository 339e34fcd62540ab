"""Classifier and reward heads (`*ForSequenceClassification`) through the engine: the pooled row's raw scores equal
transformers' within 1e-4 whatever the chunking and batching, cold and from the prefix cache (a prompt served whole
from the cache runs no layer), with pad tokens pooled as transformers pools them; the wrong task is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm_engine import RequestError
from protocol.sampling import PoolingParams, SamplingParams
from rulebook.pooling import pooled_position
from tests.helpers.engine import make_engine, rand_ids, scoring
from tests.helpers.tiny_classifiers import build_classifier, reference_scores
from tests.helpers.tiny_families import FAMILIES

CLASSIFY = SamplingParams(max_tokens=0, pooling=PoolingParams())


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("classifiers")
    return {f"{family}-{n}": build_classifier(root / f"{family}-{n}", family, n, seed=n)
            for family in ("llama", "qwen2") for n in (1, 3)}


def _check(path: Path, prompts: list[list[int]], got: list, atol: float = 1e-4) -> None:
    for ids, out in zip(prompts, got, strict=True):
        want = reference_scores(path, ids)
        assert out.pooled is not None and len(out.pooled) == len(want)
        assert max(abs(a - b) for a, b in zip(out.pooled, want, strict=True)) <= atol, (out.pooled, want)


@pytest.mark.parametrize("name", ["llama-1", "llama-3", "qwen2-1", "qwen2-3"])
@pytest.mark.parametrize("budget", [5, 64])
def test_classify_matches_transformers_any_chunking(classifiers: dict[str, Path], name: str, budget: int) -> None:
    path = classifiers[name]
    engine = make_engine(path, max_num_batched_tokens=budget)
    prompts = [rand_ids(n, seed=n) for n in (1, 7, 16, 23)]
    got = engine.generate(prompts, CLASSIFY, check=True)
    _check(path, prompts, got)
    assert all(out.input_token_logprobs is None and out.new_token_ids == [] for out in got)


@pytest.mark.parametrize("store", [True, False])
def test_classify_warm_from_the_prefix_cache(classifiers: dict[str, Path], store: bool) -> None:
    path = classifiers["llama-3"]
    engine = make_engine(path, enable_prefix_cache=True, hidden_state_store=store)
    prompts = [rand_ids(16, seed=3), rand_ids(19, seed=4)]  # 16: four whole blocks of 4
    cold = engine.generate(prompts, CLASSIFY, check=True)
    forwards = engine.runner.forwards
    warm = engine.generate(prompts[:1], CLASSIFY, check=True)
    _check(path, prompts[:1], warm)
    assert max(abs(a - b) for a, b in zip(warm[0].pooled, cold[0].pooled, strict=True)) < 1e-5
    if store:  # the whole prompt is cached and its last row is in the store: no layer runs
        assert engine.runner.forwards == forwards and warm[0].cached_tokens == 16
    else:  # without the store the pooled position is computed
        assert engine.runner.forwards == forwards + 1
    # A prompt sharing a cached head, then its own tail.
    longer = prompts[1] + rand_ids(5, seed=9)
    _check(path, [longer], engine.generate([longer], CLASSIFY, check=True))


def test_pad_tokens_pooled_as_transformers(classifiers: dict[str, Path]) -> None:
    path = classifiers["qwen2-3"]
    engine = make_engine(path, enable_prefix_cache=True)
    ids = rand_ids(9, seed=5)
    padded = [1, 1, *ids, 1, 1, 1]  # pad_token_id 1, left and right
    assert pooled_position(padded, 1) == 10
    got = engine.generate([padded, ids], CLASSIFY, check=True)
    _check(path, [padded], got[:1])
    assert max(abs(a - b) for a, b in zip(got[0].pooled, reference_scores(path, [1, 1, *ids]), strict=True)) < 1e-4


@pytest.mark.parametrize("family", [f for f in FAMILIES if f in ("qwen3", "mistral", "gemma2", "gemma3", "phi3",
                                                                 "qwen3-moe")] + ["dsv3"])
def test_every_family_classifies(tmp_path: Path, family: str) -> None:
    path = build_classifier(tmp_path / family, family, 3)
    engine = make_engine(path, enable_prefix_cache=True)
    prompts = [rand_ids(n, seed=n) for n in (3, 12, 21)]
    _check(path, prompts, engine.generate(prompts, CLASSIFY, check=True))
    _check(path, prompts, engine.generate(prompts, CLASSIFY, check=True))  # warm


def test_wrong_task_refused(classifiers: dict[str, Path], tiny_models: dict[str, Path]) -> None:
    classifier = make_engine(classifiers["llama-1"])
    with pytest.raises(RequestError, match=r"classifier \(1 label\(s\)\): it serves POST /classify"):
        classifier.add_request("a", [3, 4, 5], scoring(0))
    causal = make_engine(tiny_models["llama"])
    with pytest.raises(RequestError, match="not a classifier"):
        causal.add_request("b", [3, 4, 5], CLASSIFY)
    with pytest.raises(RequestError, match="max_tokens 0 and no logprobs"):
        classifier.add_request("c", [3, 4, 5], SamplingParams(max_tokens=2, pooling=PoolingParams()))
