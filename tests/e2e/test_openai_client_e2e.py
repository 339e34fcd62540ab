"""The APIs clients already speak, against the whole application on the session's Ray cluster with SmolLM2:
the official `openai` client (completions with echo + logprobs, chat with logprobs, streamed and not, models),
and plain HTTP for /generate batches and /v1/score. Each is held to /generate or to transformers (1e-4)."""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from openai import OpenAI
from transformers import AutoTokenizer

from tests.helpers.reference import hf_logits
from tests.helpers.serve import ids_of, shared_app, sse_events

MODEL = "smollm2-135m-instruct"
ATOL = 1e-4
QUESTION = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    """The session's shared one-worker app (tests/helpers/serve.py): this module only sends requests to it."""
    return shared_app(serve_url, num_workers=1)


@pytest.fixture(scope="module")
def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return AutoTokenizer.from_pretrained(str(smollm2_path))


def generate(url: str, body: dict) -> dict | list:
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= ATOL for x, y in zip(a, b, strict=True))


def test_models(client: OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completion_echo_logprobs_equal_generate_rows(client: OpenAI, url: str) -> None:
    ids = ids_of(30, 3)
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(ids)
    rows = generate(url, {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0})
    assert close(lp.token_logprobs[1:], [v for v, _ in rows["meta_info"]["input_token_logprobs"]])
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 0


def chat_reference(url: str, tok, max_tokens: int, k: int) -> dict:
    """/generate, greedy, on the chat-templated prompt: what the chat answer must equal."""
    ids = tok.encode(tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)
    body = {"input_ids": ids, "max_tokens": max_tokens, "temperature": 0, "return_logprob": True,
            "top_logprobs_num": k}
    return {"ids": ids, **generate(url, body)}


def test_greedy_chat_equals_generate_on_the_templated_prompt(client: OpenAI, url: str, tok, smollm2_path) -> None:
    ref = chat_reference(url, tok, 12, 3)
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, max_completion_tokens=12, temperature=0,
                                         logprobs=True, top_logprobs=3)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == ref["text"]
    assert "Paris" in ref["text"]
    content = choice.logprobs.content
    assert close([c.logprob for c in content], [v for v, _ in ref["meta_info"]["output_token_logprobs"]])
    texts = tok.batch_decode([[t] for t in ref["output_ids"]])
    assert [c.token for c in content] == texts and all(bytes(c.bytes) == c.token.encode() for c in content)
    for c, row in zip(content, ref["meta_info"]["output_top_logprobs"], strict=True):
        assert close([t.logprob for t in c.top_logprobs], [v for v, _ in row])
    assert out.usage.prompt_tokens == len(ref["ids"]) and out.usage.completion_tokens == len(ref["output_ids"])
    # And the first answer token is transformers' argmax after the prompt, with its logprob.
    first = torch.log_softmax(hf_logits(smollm2_path, ref["ids"]), -1)[-1]
    assert ref["output_ids"][0] == int(first.argmax()) and abs(content[0].logprob - first.max().item()) <= ATOL


def test_streamed_chat_equals_the_answer(client: OpenAI, url: str, tok) -> None:
    ref = chat_reference(url, tok, 8, 1)
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=1, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert deltas[0].delta.role == "assistant"
    assert "".join(d.delta.content or "" for d in deltas) == ref["text"]
    streamed = [e.logprob for d in deltas if d.logprobs for e in d.logprobs.content]
    assert close(streamed, [v for v, _ in ref["meta_info"]["output_token_logprobs"]])
    assert deltas[-1].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == len(ref["output_ids"])


def test_batch_of_ids_equals_the_single_answers(url: str) -> None:
    batch = [ids_of(n, 40 + n) for n in (9, 21, 4)]
    body = {"max_tokens": 4, "temperature": 0, "return_logprob": True, "top_logprobs_num": 2, "ignore_eos": True}
    answers = generate(url, {**body, "input_ids": batch})
    singles = [generate(url, {**body, "input_ids": ids}) for ids in batch]
    assert len(answers) == 3
    for answer, single in zip(answers, singles, strict=True):
        assert answer["output_ids"] == single["output_ids"] and answer["text"] == single["text"]
        assert close([v for v, _ in answer["meta_info"]["output_token_logprobs"]],
                     [v for v, _ in single["meta_info"]["output_token_logprobs"]])
    r = httpx.post(url + "/generate", json={**body, "input_ids": batch, "stream": True}, timeout=120)
    events = sse_events(r)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    for i, answer in enumerate(answers):
        assert sum((e["output_ids"] for e in events[:-1] if e["index"] == i), []) == answer["output_ids"]


def score_reference(path, prompts: list[list[int]], labels: list[int], apply_softmax: bool) -> list[list[float]]:
    """transformers: the label tokens' probabilities at each prompt's last position."""
    out = []
    for ids in prompts:
        logits = hf_logits(path, ids)[-1].double()
        probs = torch.softmax(logits[labels], -1) if apply_softmax else torch.softmax(logits, -1)[labels]
        out.append(probs.tolist())
    return out


@pytest.mark.parametrize("apply_softmax", [False, True])
def test_score_equals_transformers(url: str, tok, smollm2_path, apply_softmax: bool) -> None:
    labels = tok.encode(" Paris London Berlin", add_special_tokens=False)
    query, items = "The capital of France is", [" the city of", ",", " not"]
    text = {"query": query, "items": items, "label_token_ids": labels, "apply_softmax": apply_softmax}
    ids_query = ids_of(20, 1)
    ids_items = [ids_of(n, n) for n in (3, 17)]
    as_ids = {"query": ids_query, "items": ids_items, "label_token_ids": labels, "apply_softmax": apply_softmax,
              "item_first": True, "model": MODEL}
    cases = [(text, [tok.encode(query + item, add_special_tokens=False) for item in items]),
             (as_ids, [item + ids_query for item in ids_items])]
    for body, prompts in cases:
        r = httpx.post(url + "/v1/score", json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        want = score_reference(smollm2_path, prompts, labels, apply_softmax)
        assert all(close(got, ref) for got, ref in zip(answer["scores"], want, strict=True)), (answer, want)
        assert answer["object"] == "scoring" and answer["usage"]["prompt_tokens"] == sum(map(len, prompts))
        if apply_softmax:
            assert all(abs(sum(s) - 1) <= 1e-9 for s in answer["scores"])


def test_forty_labels_are_read_off_one_row_per_item_exactly(url: str, smollm2_path) -> None:
    """40 labels (above max_batch_items, 32, which bounded items x labels before) on two items: one scoring row per
    item answers them all, each label equal to transformers' next-token probability; a repeated label keeps its
    place."""
    labels = [*ids_of(40, 77), 5]
    labels[-1] = labels[3]
    query, items = ids_of(12, 2), [ids_of(5, 8), ids_of(9, 9)]
    for apply_softmax in (False, True):
        body = {"query": query, "items": items, "label_token_ids": labels, "apply_softmax": apply_softmax}
        r = httpx.post(url + "/v1/score", json=body, timeout=120)
        assert r.status_code == 200, r.text
        want = score_reference(smollm2_path, [query + item for item in items], labels, apply_softmax)
        got = r.json()["scores"]
        # Random labels are unlikely tokens: compared as logprobs, where 1e-4 means something.
        logs = [[math.log(p) for p in row] for row in got]
        assert all(close(a, [math.log(p) for p in b]) for a, b in zip(logs, want, strict=True)), (got, want)
        assert all(len(row) == 41 and row[-1] == row[3] for row in got)
