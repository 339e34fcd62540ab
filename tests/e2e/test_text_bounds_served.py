"""Texts are bounded before they are tokenized, and tokenizing runs off the worker's event loop: a text over
max_model_len x max_prompt_chars_per_token is a 400 naming the field on every route that
tokenizes (/generate's text prompt, /tokenize, chat), while a long text under it is tokenized as the worker keeps
answering another client; afterwards a known scoring request returns the same rows."""

from __future__ import annotations

import threading

import httpx
import pytest
from ray import serve

from tests.helpers.serve import app_args, deploy, ids_of

APP, PREFIX = "text-bounds", "/text-bounds"
PER_TOKEN = 4  # max_model_len 2,048 x 4 = 8,192 characters
SCORE = {"input_ids": ids_of(40, 7), "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    deploy(APP, PREFIX, app_args(num_workers=1, max_model_len=2048, max_prompt_chars_per_token=PER_TOKEN))
    yield serve_url + PREFIX
    serve.delete(APP)


def test_over_long_texts_are_400_naming_the_field(url: str) -> None:
    text = "word " * 2000  # 10,000 characters
    cases = [("/generate", {"prompt": text, "max_tokens": 1}),
             ("/tokenize", {"prompt": text}),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1})]
    for path, body in cases:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 400, (path, r.text)
        assert "`max_prompt_chars_per_token`" in r.text and "10000 characters" in r.text, (path, r.text)


def test_tokenizer_routes_take_the_largest_body_and_refuse_the_next(url: str) -> None:
    """The bounds are checked before any work, on the served app: /tokenize takes max_model_len x
    max_prompt_chars_per_token characters, /detokenize max_model_len ids; one more is a 400 naming the limit (never
    a 503, which a retry cannot fix), as is the 1.9 M ids (3.8 MB) body that was a 503."""
    limit_chars, limit_ids = 2048 * PER_TOKEN, 2048
    r = httpx.post(url + "/tokenize", json={"prompt": "a" * limit_chars}, timeout=120)
    assert r.status_code == 200 and r.json()["count"] > 0, r.text
    r = httpx.post(url + "/tokenize", json={"prompt": "a" * (limit_chars + 1)}, timeout=60)
    assert r.status_code == 400 and "`max_prompt_chars_per_token`" in r.text, r.text
    ids = ids_of(limit_ids, 3)
    r = httpx.post(url + "/detokenize", json={"tokens": ids}, timeout=120)
    assert r.status_code == 200 and r.json()["prompt"], r.text
    for tokens in (ids + [5], [5] * 1_900_000):
        r = httpx.post(url + "/detokenize", json={"tokens": tokens}, timeout=120)
        assert r.status_code == 400 and "max_model_len = 2048" in r.text, r.text[:300]
        assert r.json()["error"]["param"] == "tokens"


def test_a_long_text_under_the_bound_is_tokenized_while_others_are_answered(url: str) -> None:
    before = httpx.post(url + "/generate", json=SCORE, timeout=60).json()["meta_info"]["input_token_logprobs"]
    text = "ab, " * 2000  # 8,000 characters: under the bound
    done, answered = threading.Event(), []

    def other() -> None:
        while not done.is_set():
            answered.append(httpx.post(url + "/tokenize", json={"prompt": "hi"}, timeout=60).status_code)

    t = threading.Thread(target=other)
    t.start()
    try:
        for _ in range(3):
            r = httpx.post(url + "/tokenize", json={"prompt": text}, timeout=60)
            assert r.status_code == 200 and r.json()["count"] > 0
    finally:
        done.set()
        t.join()
    assert answered and set(answered) == {200}
    after = httpx.post(url + "/generate", json=SCORE, timeout=60).json()["meta_info"]["input_token_logprobs"]
    # The same rows (the default mode: a warm cache rounds the last bits otherwise, within float32's 1e-5).
    assert [t for _, t in after] == [t for _, t in before]
    assert max(abs(a - b) for (a, _), (b, _) in zip(after, before, strict=True)) < 1e-4
