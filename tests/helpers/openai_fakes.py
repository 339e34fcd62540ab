"""A fake worker for the OpenAI-compatible routes' unit tests, and the calls those tests make.

No Ray: the app of `build_fastapi_app` over a fake worker whose tokenizer maps each printable character to
one id (id = ord(c) - 32), whose chat template writes `role: content|` per message, and whose model scores and
generates deterministically.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from ingress.app import build_fastapi_app
from protocol import (
    ChatPrompt,
    FinishReason,
    GenerateRequest,
    ModelInfo,
    RequestOutput,
    TokenizerInfo,
    error_chunk,
)
from tests.helpers.fakes import FakeBackend

INFO = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=64, logprobs_mode="raw_logprobs")


def text_of(i: int) -> str:
    return chr(i + 32)


def value(pos: int, token: int) -> float:
    """The fake model's log p(token | first pos tokens)."""
    return -0.25 * (pos % 5) - 0.01 * token


def rank(token: int) -> int:
    """The fake model's rank of a scored prompt token (return_input_ranks)."""
    return token + 1


def model(req: GenerateRequest):
    """Scores ids[N+1:] in the first chunk, then generates id = previous + 1, one token per chunk."""
    ids = list(req.input_ids)
    if not ids:  # the worker's 400 (the routes refuse an empty prompt first)
        yield error_chunk(req.rid, "The prompt must not be an empty string", 400)
        return
    k = req.params.top_logprobs_num
    rows = tops = ranks = cands = None
    start = req.params.logprob_start_len
    if start >= 0:
        rows = [[value(p, ids[p]), ids[p]] for p in range(start + 1, len(ids))]
        tops = [[[-0.001 * j, j] for j in range(k)] for _ in rows] if k else None
        ranks = [rank(t) for _, t in rows] if req.params.return_input_ranks else None
        if req.params.asks_token_ids:  # each row's own ids (one list for all, or per row)
            asked = req.params.row_token_ids(start, len(ids) - 2)
            cands = [[[value(start + 1 + r, t), t] for t in row or []] for r, row in enumerate(asked)]
    if req.params.max_tokens == 0:
        yield RequestOutput(request_id=req.rid, finished=True, finish_reason=FinishReason("length"),
                            prompt_tokens=len(ids),
                            input_token_logprobs=rows, input_top_logprobs=tops, input_token_ranks=ranks,
                            input_token_ids_logprobs=cands)
        return
    lp = req.params.return_logprob
    tok = ids[-1]
    for i in range(req.params.max_tokens):
        tok = (tok + 1) % INFO.vocab_size
        last = i == req.params.max_tokens - 1
        yield RequestOutput(
            request_id=req.rid, text=text_of(tok), new_token_ids=[tok], finished=last,
            finish_reason=FinishReason("length") if last else None, prompt_tokens=len(ids), completion_tokens=i + 1,
            input_token_logprobs=(rows if i == 0 else []) if rows is not None else None,
            input_top_logprobs=(tops if i == 0 else []) if tops is not None else None,
            input_token_ranks=(ranks if i == 0 else []) if ranks is not None else None,
            input_token_ids_logprobs=(cands if i == 0 else []) if cands is not None else None,
            output_token_logprobs=[[value(len(ids) + i, tok), tok]] if lp else None,
            output_top_logprobs=([[[-0.001 * j, j] for j in range(k)]] if k else []) if lp else None)


class Backend(FakeBackend):
    def __init__(self, script=model) -> None:
        super().__init__(script)
        self.info = INFO
        self.token_text_calls = 0
        self.tokenize_calls = 0  # tokenize_many calls: one per request, whatever its number of texts
        self.chat_messages: list[list[dict[str, str]]] = []

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([99] if add_special_tokens else []) + [ord(c) - 32 for c in text]

    async def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        self.tokenize_calls += 1
        return [await self.tokenize(t) for t in texts]

    async def detokenize(self, ids: list[int]) -> str:
        return "".join(text_of(i) for i in ids)

    async def detokenize_many(self, prompts: list[list[int]]) -> list[str]:
        return [await self.detokenize(ids) for ids in prompts]

    async def token_texts(self, ids: list[int]) -> list[str]:
        self.token_text_calls += 1
        return [text_of(i) for i in ids]

    async def apply_chat_template(self, messages: list[dict[str, Any]],
                                  image_ids: tuple[int, ...] = ()) -> ChatPrompt:
        self.chat_messages.append(messages)
        if any(m["role"] not in ("system", "user", "assistant") for m in messages):
            return ChatPrompt([], error="The chat template rejected the messages: unknown role")
        text = "".join(f"{m['role']}: {m['content']}|" for m in messages) + "assistant: "
        return ChatPrompt(await self.tokenize(text))

    async def tokenizer_info(self) -> TokenizerInfo:
        return TokenizerInfo(model_name="tiny", tokenizer_class="Fake", vocab_size=100, max_model_len=64,
                             eos_token="~", eos_token_id=94, bos_token=None, bos_token_id=None, pad_token=None,
                             pad_token_id=None, chat_template="{{ messages }}")


async def call(backend: Backend, method: str, path: str, body: object = None, **kwargs) -> httpx.Response:
    app = build_fastapi_app(backend)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        if isinstance(body, (bytes, str)):
            return await c.request(method, path, content=body, headers={"content-type": "application/json"})
        return await c.request(method, path, json=body, **kwargs)


async def complete(body: dict, backend: Backend | None = None) -> httpx.Response:
    return await call(backend or Backend(), "POST", "/v1/completions", body)


def sse(resp: httpx.Response) -> list:
    assert resp.headers["content-type"].startswith("text/event-stream")
    blocks = resp.text.split("\n\n")
    assert blocks[-1] == "" and all(b.startswith("data: ") for b in blocks[:-1])
    out = [b[6:] if b[6:] == "[DONE]" else json.loads(b[6:]) for b in blocks[:-1]]
    assert out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return out[:-1]


def error(resp: httpx.Response, status: int, param: str | None = None) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]["message"]
