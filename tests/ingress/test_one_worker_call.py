"""One HTTP request, one worker call: the real HandleBackend, with this replica's own tokenizer (ingress/text.py,
loaded from the embedded model's folder), over a handle that counts every worker method called. Text prompts,
echo, the token texts of logprob entries, chat templates and streamed deltas cost no call of their own; /tokenize
and /detokenize cost none. The worker behind the handle is the fake of the ingress tests (its answers are
checked elsewhere); what is counted here is the traffic."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.transport import HandleBackend
from tests.helpers.fakes import INFO, FakeBackend
from workers.many import merged


class _Response:
    """A DeploymentResponse (awaitable) or DeploymentResponseGenerator (async iterable) over a fake worker call."""

    def __init__(self, whole: Any = None, stream: AsyncIterator[Any] | None = None) -> None:
        self._whole, self._stream = whole, stream

    def __await__(self):  # noqa: ANN204
        return self._whole.__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        assert self._stream is not None
        return self._stream

    def cancel(self) -> None:
        pass


class _Method:
    def __init__(self, handle: CountingHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, *args: Any) -> _Response:
        self.handle.calls[self.name] += 1
        worker = self.handle.worker
        if self.name == "generate":
            return _Response(stream=worker.stream(args[0]))
        if self.name == "generate_many":
            return _Response(stream=merged([worker.stream(r) for r in args[0]]))
        if self.name == "generate_whole":
            return _Response(whole=worker.answers(args[0]))
        if self.name == "model_info":
            return _Response(whole=worker.model_info())
        raise AssertionError(f"the ingress called the worker's {self.name}")


class CountingHandle:
    """The worker deployment's handle (options() like Serve's), counting each method called on any of its views."""

    def __init__(self, worker: FakeBackend, calls: Counter[str] | None = None) -> None:
        self.worker = worker
        self.calls: Counter[str] = calls if calls is not None else Counter()

    def options(self, **_: Any) -> CountingHandle:
        return CountingHandle(self.worker, self.calls)

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


@pytest.fixture
def counted(smollm2_path: Path) -> tuple[httpx.AsyncClient, Counter[str]]:
    worker = FakeBackend()
    # The embedded model's vocabulary (its prompts' ids are in range); the fake worker answers ids below 100.
    worker.info = dataclasses.replace(INFO, model_path=str(smollm2_path), vocab_size=49152)
    handle = CountingHandle(worker)
    app = build_fastapi_app(HandleBackend(handle))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test"), handle.calls


def _worker_calls(calls: Counter[str]) -> dict[str, int]:
    """The calls an HTTP request made (model_info is the periodic refresh, not the request's)."""
    return {k: v for k, v in calls.items() if k != "model_info"}


async def _warm(c: httpx.AsyncClient, calls: Counter[str]) -> None:
    """The first request loads the tokenizer (once per replica); counting starts after it."""
    assert (await c.post("/tokenize", json={"prompt": "warm"})).status_code == 200
    calls.clear()


async def test_completions_of_8_text_prompts_with_echo_and_logprobs(counted) -> None:  # noqa: ANN001
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"model": "tiny", "prompt": [f"prompt number {i}" for i in range(8)], "max_tokens": 2, "echo": True,
                "logprobs": 2}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        assert len(choices) == 8 and all(ch["text"].startswith(f"prompt number {i}") for i, ch in enumerate(choices))
        assert all(ch["logprobs"]["tokens"] for ch in choices)
    assert _worker_calls(calls) == {"generate_whole": 1}


async def test_streamed_chat_of_32_tokens(counted) -> None:  # noqa: ANN001
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 32,
                "stream": True, "logprobs": True, "top_logprobs": 2}
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        tokens = [e for ev in events for ch in ev["choices"] for e in ((ch.get("logprobs") or {}).get("content") or [])]
        assert len(tokens) == 32 and all(t["top_logprobs"] for t in tokens)
    assert _worker_calls(calls) == {"generate": 1}


async def test_sglang_text_generate(counted) -> None:  # noqa: ANN001
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4},
                "return_logprob": True, "logprob_start_len": 0, "return_text_in_logprobs": True}
        r = await c.post("/generate", json=body)
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        assert meta["input_token_logprobs"][0][2] == "The"  # the text of each entry, from the ingress tokenizer
        assert len(meta["output_token_logprobs"]) == 4 and all(e[2] for e in meta["output_token_logprobs"])
    assert _worker_calls(calls) == {"generate_whole": 1}


async def test_score(counted) -> None:  # noqa: ANN001
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"query": "Is this good?", "items": ["yes it is", "no", "maybe so"], "label_token_ids": [1, 2]}
        r = await c.post("/v1/score", json=body)
        assert r.status_code == 200, r.text
        assert len(r.json()["scores"]) == 3
    assert _worker_calls(calls) == {"generate_whole": 1}


async def test_tokenizer_routes_and_seed_text_prompt(counted, smollm2_path: Path) -> None:  # noqa: ANN001
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    c, calls = counted
    async with c:
        await _warm(c, calls)
        ids = (await c.post("/tokenize", json={"prompt": "Hello world"})).json()["tokens"]
        assert ids == tok.encode("Hello world", add_special_tokens=False)
        assert (await c.post("/detokenize", json={"tokens": ids})).json()["prompt"] == "Hello world"
        assert (await c.get("/tokenizer_info")).json()["eos_token"] == tok.eos_token
        assert _worker_calls(calls) == {}
        # The seed route's text prompt reaches the worker as ids: the worker takes ids only.
        r = await c.post("/generate", json={"prompt": "Hello world", "max_tokens": 1})
        assert r.status_code == 200, r.text
    assert _worker_calls(calls) == {"generate_whole": 1}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_is_matched_here_in_one_worker_call(counted, stream: bool) -> None:  # noqa: ANN001
    """The fake worker generates ids 41, 42, ... ("9", ":", ";", "<", ...) and knows nothing of stop strings: the
    ingress matches them, ends the answer and closes the call; streamed or not, that is one call."""
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"model": "tiny", "prompt": [40], "max_tokens": 10, "stop": [";<"], "stream": stream}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        if stream:
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            text = "".join(ch["text"] for ev in events for ch in ev["choices"])
            finish = [ch["finish_reason"] for ev in events for ch in ev["choices"] if ch["finish_reason"]]
        else:
            text, finish = r.json()["choices"][0]["text"], [r.json()["choices"][0]["finish_reason"]]
        assert text == "9:" and finish == ["stop"]
    assert _worker_calls(calls) == {"generate": 1}


async def test_a_text_prompt_the_rules_refuse_never_reaches_a_worker(smollm2_path: Path) -> None:
    """/generate's text prompts are tokenized in its parse, as every dialect's are: an over-long text, one past the
    context once tokenized, or a batch item past it is refused here, before any worker call."""
    worker = FakeBackend()
    worker.info = dataclasses.replace(INFO, model_path=str(smollm2_path), vocab_size=49152, max_model_len=64,
                                      prompt_chars_per_token=8)
    handle = CountingHandle(worker)
    app = build_fastapi_app(HandleBackend(handle))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        long = await c.post("/generate", json={"prompt": "x" * 600, "max_tokens": 1})
        assert long.status_code == 400 and "max_prompt_chars_per_token" in long.json()["message"]
        words = " ".join(["word"] * 60)  # 299 characters, within 64 x 8; 60 tokens, past 64 with 8 to generate
        past = await c.post("/generate", json={"prompt": words, "max_tokens": 8})
        assert past.status_code == 400 and past.json()["message"].startswith("The prompt length 60 plus max_tokens 8")
        exchange = await c.post("/generate", json={"prompt": ["hi", words], "max_tokens": 8})
        assert exchange.status_code == 400 and exchange.json()["message"].startswith("Item 1: The prompt length 60")
    assert _worker_calls(handle.calls) == {}


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_streamed_completions_of_4_text_prompts(counted) -> None:  # noqa: ANN001
    """The 4 prompts' deltas come from one streaming call (generate_many) and add up to the unary call's answers."""
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"model": "tiny", "prompt": [f"prompt number {i}" for i in range(4)], "max_tokens": 5, "logprobs": 1}
        whole = await c.post("/v1/completions", json=body)
        assert whole.status_code == 200, whole.text
        assert _worker_calls(calls) == {"generate_whole": 1}
        calls.clear()
        r = await c.post("/v1/completions", json={**body, "stream": True})
        assert r.status_code == 200, r.text
    assert _worker_calls(calls) == {"generate_many": 1}
    texts, tokens, finishes = [""] * 4, [[] for _ in range(4)], [None] * 4
    for ev in _events(r.text):
        for ch in ev["choices"]:
            texts[ch["index"]] += ch["text"]
            tokens[ch["index"]] += (ch.get("logprobs") or {}).get("tokens") or []
            finishes[ch["index"]] = ch["finish_reason"] or finishes[ch["index"]]
    answers = whole.json()["choices"]
    assert texts == [ch["text"] for ch in answers] and all(texts)
    assert tokens == [ch["logprobs"]["tokens"] for ch in answers]
    assert finishes == [ch["finish_reason"] for ch in answers] == ["length"] * 4


async def test_streamed_sglang_batch_generate(counted) -> None:  # noqa: ANN001
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"text": ["The capital of France is", "Once upon a time", "2 + 2 ="],
                "sampling_params": {"max_new_tokens": 4}}
        whole = await c.post("/generate", json=body)
        assert whole.status_code == 200, whole.text
        calls.clear()
        r = await c.post("/generate", json={**body, "stream": True})
        assert r.status_code == 200, r.text
    assert _worker_calls(calls) == {"generate_many": 1}
    last: dict[int, dict[str, Any]] = {}
    for ev in _events(r.text):  # each event is its item's answer so far: the last one is the whole answer
        last[ev["index"]] = ev
    assert sorted(last) == [0, 1, 2]
    for i, answer in enumerate(whole.json()):
        assert (last[i]["text"], last[i]["output_ids"]) == (answer["text"], answer["output_ids"])
        assert len(answer["output_ids"]) == 4


async def test_streamed_prompts_with_stop_strings_keep_a_call_each(counted) -> None:  # noqa: ANN001
    """A stop string ends its request by closing its call, and a call is closed as a whole: such requests are the
    one exception to one call per HTTP request."""
    c, calls = counted
    async with c:
        await _warm(c, calls)
        body = {"model": "tiny", "prompt": [[40], [40]], "max_tokens": 10, "stop": [";<"], "stream": True}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
    texts = ["", ""]
    for ev in _events(r.text):
        for ch in ev["choices"]:
            texts[ch["index"]] += ch["text"]
    assert texts == ["9:", "9:"]
    assert _worker_calls(calls) == {"generate": 2}
