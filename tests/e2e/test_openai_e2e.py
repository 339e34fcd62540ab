"""The OpenAI-compatible routes of the whole application on the session's Ray cluster, over HTTP, with
SmolLM2: prompt logprobs equal /generate's scoring rows and the transformers forward (float32, 1e-4)."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.helpers.reference import hf_logits, hf_scores
from tests.helpers.serve import ids_of, shared_app, shared_name, sse_events, worker_stats

# The session's shared one-worker app (tests/helpers/serve.py: shared_app): this module only sends requests to it.
APP = shared_name(num_workers=1)
MODEL = "smollm2-135m-instruct"
ATOL = 1e-4


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    return shared_app(serve_url, num_workers=1)


def completion(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def generate_rows(url: str, ids: list[int]) -> list[float]:
    body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return [v for v, _ in r.json()["meta_info"]["input_token_logprobs"]]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_prompt_logprobs_equal_generate_and_transformers(url: str, smollm2_path, max_tokens: int) -> None:
    ids = ids_of(40, 11)
    body = completion(url, prompt=[ids], max_tokens=max_tokens, echo=True, logprobs=1, temperature=0)
    (choice,) = body["choices"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + max_tokens and len(lp["text_offset"]) == len(ids) + max_tokens
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    prompt_rows = lp["token_logprobs"][1:len(ids)]
    assert max_diff(prompt_rows, hf_scores(smollm2_path, ids, 0)) <= ATOL
    assert max_diff(prompt_rows, generate_rows(url, ids)) <= ATOL
    assert body["usage"] == {"prompt_tokens": 40, "completion_tokens": max_tokens, "total_tokens": 40 + max_tokens}
    assert choice["finish_reason"] == "length"
    if max_tokens:
        # Greedy: the generated token is the argmax after the whole prompt, with its logprob.
        lps = torch.log_softmax(hf_logits(smollm2_path, ids), -1)[-1]
        assert abs(lp["token_logprobs"][-1] - lps.max().item()) <= ATOL
        assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_batch_prompt_logprobs_equal_transformers(url: str, smollm2_path, max_tokens: int) -> None:
    prompts = [ids_of(n, 20 + n) for n in (5, 33, 2, 17)]
    body = completion(url, prompt=prompts, max_tokens=max_tokens, echo=True, logprobs=3, temperature=0)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for ids, choice in zip(prompts, body["choices"], strict=True):
        rows = choice["logprobs"]["token_logprobs"][1:len(ids)]
        assert max_diff(rows, hf_scores(smollm2_path, ids, 0)) <= ATOL
        lps = torch.log_softmax(hf_logits(smollm2_path, ids), -1)
        for pos, top in enumerate(choice["logprobs"]["top_logprobs"][1:len(ids)]):
            best = torch.topk(lps[pos], 3).values.tolist()
            # the 3 most likely (as texts; ids sharing a text keep the higher) and the actual token
            assert 1 <= len(top) <= 4 and max(top.values()) == pytest.approx(best[0], abs=ATOL)


def test_text_prompt_echo_tokens_and_offsets(url: str, smollm2_path) -> None:
    text = "The capital of France is"
    ids = httpx.post(url + "/tokenize", json={"prompt": text}, timeout=60).json()["tokens"]
    body = completion(url, prompt=text, max_tokens=3, echo=True, logprobs=0, temperature=0)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(text) and "".join(lp["tokens"][:len(ids)]) == text
    assert lp["text_offset"][:len(ids)] == [len("".join(lp["tokens"][:i])) for i in range(len(ids))]
    assert max_diff(lp["token_logprobs"][1:len(ids)], hf_scores(smollm2_path, ids, 0)) <= ATOL
    assert all(len(top) == 1 for top in lp["top_logprobs"][1:])  # logprobs 0: the actual token only
    assert " Paris" in choice["text"][len(text):]


def test_stream_concatenates_to_the_answer(url: str) -> None:
    """Several streamed prompts: one worker call, whose deltas add up to the unary answers."""
    prompts = [ids_of(12, 5), ids_of(7, 6)]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 4, "echo": True, "logprobs": 2, "temperature": 0,
            "ignore_eos": True}
    whole = completion(url, **{k: v for k, v in body.items() if k != "model"})
    before = worker_stats(APP, samples=4)
    r = httpx.post(url + "/v1/completions", json={**body, "stream": True}, timeout=120)
    after = worker_stats(APP, samples=4)
    # Both prompts are one streaming call over Serve (generate_many), not a call each.
    assert sum(after[p].stream_calls - before[p].stream_calls for p in before) == 1
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    for choice in whole["choices"]:
        mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == choice["index"]]
        assert "".join(m["text"] for m in mine) == choice["text"] and mine[-1]["finish_reason"] == "length"
        streamed = sum((m["logprobs"]["token_logprobs"] for m in mine), [])
        assert streamed[0] is None and max_diff(streamed[1:], choice["logprobs"]["token_logprobs"][1:]) <= ATOL


def test_models_and_tokenizer_routes(url: str, smollm2_path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    models = httpx.get(url + "/v1/models", timeout=60).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    text = "Hello, world! Ünïcödé"
    ids = httpx.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=60).json()
    assert ids["tokens"] == tok.encode(text, add_special_tokens=False) and ids["count"] == len(ids["tokens"])
    back = httpx.post(url + "/detokenize", json={"tokens": ids["tokens"]}, timeout=60).json()
    assert back == {"prompt": text}
    info = httpx.get(url + "/tokenizer_info", timeout=60).json()
    assert info["eos_token"] == tok.eos_token and info["eos_token_id"] == tok.eos_token_id
    assert info["chat_template"] == tok.chat_template and info["vocab_size"] == 49152


@pytest.mark.parametrize("body, status, param", [
    ({"model": "gpt-3.5-turbo-instruct", "prompt": "Hi"}, 404, "model"),
    ({"model": MODEL, "prompt": "Hi", "n": 2}, 400, "n"),
    ({"model": MODEL, "prompt": "Hi", "logprobs": -1}, 400, "logprobs"),
    ({"model": MODEL, "prompt": [[1, 49152]]}, 400, "prompt"),
    ({"model": MODEL, "prompt": "hello " * 8200, "max_tokens": 1}, 400, "prompt"),
    ({"model": MODEL, "prompt": [1] * 8000, "max_tokens": 500}, 400, "prompt"),
    ({"model": MODEL, "prompt": {"a": 1}}, 422, "prompt"),
])
def test_errors_over_http(url: str, body: dict, status: int, param: str) -> None:
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == status
