"""POST /classify (vLLM's and SGLang's shapes) and /pooling over a real engine on tiny classifiers (in process, no
Ray): every answer within 1e-4 of transformers' pooled scores, activated as vLLM does; the shapes told apart by
their fields; the other routes refused on a classifier, naming the routes it serves."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from engine.llm_engine import LLMEngine
from ingress.classify.activation import activate
from protocol import GenerateRequest, ModelInfo, RequestOutput
from tests.helpers.engine import make_engine, rand_ids
from tests.helpers.fakes import FakeBackend, client
from tests.helpers.tiny_classifiers import LABELS, build_classifier, reference_scores

ATOL = 1e-4


class EngineBackend(FakeBackend):
    """The real engine behind the ingress's Backend: classify requests answered by LLMEngine.generate."""

    def __init__(self, engine: LLMEngine) -> None:
        super().__init__()
        self.engine = engine
        self.info = ModelInfo(model_name="tiny-classifier", vocab_size=engine.vocab_size,
                              max_model_len=engine.max_model_len, logprobs_mode="raw_logprobs",
                              num_labels=engine.model.num_labels, id2label=dict(engine.hf_config.id2label),
                              problem_type=engine.hf_config.problem_type)

    async def answers(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        self.requests.extend(reqs)
        return self.engine.generate([r.input_ids or [] for r in reqs], [r.params for r in reqs], check=True)

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)


@pytest.fixture(scope="module", params=[("llama", 1), ("qwen2", 3)], ids=["llama-1", "qwen2-3"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, EngineBackend]:
    family, n = request.param
    path = build_classifier(tmp_path_factory.mktemp(f"{family}-{n}"), family, n, seed=n)
    return path, EngineBackend(make_engine(path, enable_prefix_cache=True))


async def _post(backend: EngineBackend, route: str, body: dict) -> httpx.Response:
    async with client(backend) as c:
        return await c.post(route, json=body)


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want, strict=True)) <= ATOL


async def test_vllm_classify_ids_and_text(served: tuple[Path, EngineBackend]) -> None:
    path, backend = served
    prompts = [rand_ids(9, seed=1), rand_ids(17, seed=2)]
    for _ in range(2):  # cold, then warm from the prefix cache
        r = await _post(backend, "/classify", {"model": "tiny-classifier", "input": prompts})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["usage"]["prompt_tokens"] == 26
        for i, (item, ids) in enumerate(zip(body["data"], prompts, strict=True)):
            raw = reference_scores(path, ids)
            assert item["index"] == i and item["num_classes"] == len(raw)
            assert _close(item["probs"], activate(raw, None))
            best = max(range(len(raw)), key=lambda j: item["probs"][j])
            assert item["label"] == LABELS[len(raw)][best]
    text = "The quick brown fox"
    ids = backend.engine.tokenizer.encode(text, add_special_tokens=True)
    r = await _post(backend, "/classify", {"input": text, "use_activation": False})
    assert r.status_code == 200, r.text
    assert _close(r.json()["data"][0]["probs"], reference_scores(path, ids))


async def test_one_label_is_a_sigmoid(served: tuple[Path, EngineBackend]) -> None:
    path, backend = served
    ids = rand_ids(6, seed=3)
    raw = reference_scores(path, ids)
    r = await _post(backend, "/classify", {"input": ids})
    probs = r.json()["data"][0]["probs"]
    if len(raw) == 1:
        assert abs(probs[0] - 1 / (1 + math.exp(-raw[0]))) <= ATOL
    else:
        assert abs(sum(probs) - 1) < 1e-6


async def test_sglang_classify_single_and_batch(served: tuple[Path, EngineBackend]) -> None:
    path, backend = served
    prompts = [rand_ids(5, seed=4), rand_ids(12, seed=5)]
    r = await _post(backend, "/classify", {"input_ids": prompts[0]})
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), dict) and _close(r.json()["embedding"], reference_scores(path, prompts[0]))
    r = await _post(backend, "/classify", {"input_ids": prompts, "rid": ["a", "b"]})
    answers = r.json()
    assert [a["meta_info"]["id"] for a in answers] == ["a", "b"]
    for a, ids in zip(answers, prompts, strict=True):
        assert _close(a["embedding"], reference_scores(path, ids)) and a["meta_info"]["prompt_tokens"] == len(ids)
    assert answers[0]["meta_info"]["cached_tokens"] == 4  # the single request's full block, from the cache
    r = await _post(backend, "/classify", {"text": ["Hello world", "Ray Serve"]})
    assert r.status_code == 200 and len(r.json()) == 2


async def test_pooling(served: tuple[Path, EngineBackend]) -> None:
    path, backend = served
    ids = rand_ids(8, seed=6)
    r = await _post(backend, "/pooling", {"input": [ids], "use_activation": False})
    assert r.status_code == 200, r.text
    item = r.json()["data"][0]
    assert item["object"] == "pooling" and _close(item["data"], reference_scores(path, ids))
    r = await _post(backend, "/pooling", {"input": ids, "task": "embed"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "task"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [3, 4], "text": "x"}, "text"),
    ({"input": [3, 4], "rid": "x"}, "rid"),
    ({"model": "tiny-classifier"}, "input"),
    ({"input": []}, "input"),
    ({"input_ids": [[3, 4], [999999]]}, "input_ids"),
    ({"text": "a", "input_ids": [3]}, "text"),
])
async def test_bad_bodies_named(served: tuple[Path, EngineBackend], body: dict, param: str) -> None:
    r = await _post(served[1], "/classify", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_unknown_field_is_422(served: tuple[Path, EngineBackend]) -> None:
    r = await _post(served[1], "/classify", {"input": [3, 4], "softmax": True})
    assert r.status_code == 422 and "softmax" in r.text


@pytest.mark.parametrize(("route", "body"), [
    ("/generate", {"input_ids": [3, 4], "max_tokens": 2}),
    ("/v1/completions", {"prompt": [3, 4], "max_tokens": 2}),
    ("/v1/score", {"query": [3], "items": [[4]], "label_token_ids": [5]}),
])
async def test_other_routes_refused_on_a_classifier(served: tuple[Path, EngineBackend], route: str,
                                                    body: dict) -> None:
    r = await _post(served[1], route, body)
    assert r.status_code == 400, r.text
    assert "POST /classify" in r.text and "POST /pooling" in r.text


async def test_classify_refused_on_a_causal_lm() -> None:
    r = await _post(FakeBackend(), "/classify", {"input": [3, 4]})
    assert r.status_code == 400 and "not a classifier" in r.text
