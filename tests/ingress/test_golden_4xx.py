"""Every route's 4xx answers, status and body byte for byte, against a recording made on the code before the
corridor's refactor (issue 51): a change of the ingress's parse, checks or routers that moved a message, a field
name or a status shows here as the first case that differs.

No Ray: the app over the OpenAI fakes' worker (tests/helpers/openai_fakes.py), a causal LM and a classifier. Record
again (only when a change of an error is meant) with RAYSCORE_GOLDEN_RECORD=1.

Changed on purpose since the first recording: `gen-too-long-text` and `gen-batch-text-long` (a /generate text prompt
past the context) were the engine's 400 (the fake worker here checks no context, hence 200 then) and are now the
ingress's, with the same rulebook message and body: /generate tokenizes in its parse, as every dialect does.
`cls-empty-text` (/classify `{"input": ""}`) was a 503 (the tokenizer's BOS alone went to the worker, and the fake
classifier's answer had no scores: AssertionError) and is now the 400 every route gives an empty text prompt,
naming `input`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.settings import IngressSettings
from protocol import ModelInfo
from tests.helpers.openai_fakes import INFO, Backend

GOLDEN = Path(__file__).with_name("golden_4xx.json")
IDS = [40, 41, 42, 43, 44]
CLASSIFIER = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=64, logprobs_mode="raw_logprobs",
                       num_labels=2, id2label={0: "no", 1: "yes"})
MSG = [{"role": "user", "content": "hi"}]
LONG = "x" * 70  # over the fake's 64-token context
SCORE = {"query": "q", "items": ["a", "b"], "label_token_ids": [3, 4]}

# (case id, method, path, body: dict | str (raw) | None, classifier model?)
Case = tuple[str, str, str, Any, bool]
CASES: list[Case] = [
    # --- /generate, the seed's shape: the contract's rules in order, batches, bodies of the wrong shape
    ("gen-not-json", "POST", "/generate", "{", False),
    ("gen-not-object", "POST", "/generate", "[1]", False),
    ("gen-wrong-type", "POST", "/generate", {"input_ids": "abc"}, False),
    ("gen-neg-top", "POST", "/generate", {"input_ids": IDS, "top_logprobs_num": -1}, False),
    ("gen-top-no-lp", "POST", "/generate", {"input_ids": IDS, "top_logprobs_num": 2}, False),
    ("gen-no-prompt", "POST", "/generate", {"max_tokens": 1}, False),
    ("gen-both-prompts", "POST", "/generate", {"prompt": "a", "input_ids": [1]}, False),
    ("gen-empty-text", "POST", "/generate", {"prompt": ""}, False),
    ("gen-empty-ids", "POST", "/generate", {"input_ids": []}, False),
    ("gen-image", "POST", "/generate", {"input_ids": IDS, "image_data": "data:x"}, False),
    ("gen-neg-max", "POST", "/generate", {"input_ids": IDS, "max_tokens": -1}, False),
    ("gen-start-no-lp", "POST", "/generate", {"input_ids": IDS, "max_tokens": 0, "logprob_start_len": 1}, False),
    ("gen-start-gen", "POST", "/generate", {"input_ids": IDS, "max_tokens": 2, "return_logprob": True,
                                            "logprob_start_len": 1}, False),
    ("gen-start-text", "POST", "/generate", {"prompt": "abc", "max_tokens": 0, "return_logprob": True,
                                             "logprob_start_len": 0}, False),
    ("gen-start-past", "POST", "/generate", {"input_ids": IDS, "max_tokens": 0, "return_logprob": True,
                                             "logprob_start_len": 9}, False),
    ("gen-nothing", "POST", "/generate", {"input_ids": IDS, "max_tokens": 0}, False),
    ("gen-oov", "POST", "/generate", {"input_ids": [1, 100]}, False),
    ("gen-too-long-ids", "POST", "/generate", {"input_ids": [1] * 60, "max_tokens": 10}, False),
    ("gen-too-long-text", "POST", "/generate", {"prompt": LONG, "max_tokens": 1}, False),
    ("gen-temperature", "POST", "/generate", {"input_ids": IDS, "max_tokens": 1, "temperature": -1}, False),
    ("gen-top-p", "POST", "/generate", {"input_ids": IDS, "max_tokens": 1, "top_p": 0}, False),
    ("gen-default-max", "POST", "/generate", {"input_ids": IDS}, False),
    ("gen-unknown", "POST", "/generate", {"input_ids": IDS, "frobnicate": 1}, False),
    ("gen-rid-list", "POST", "/generate", {"input_ids": IDS, "rid": ["a"]}, False),
    ("gen-empty-batch", "POST", "/generate", {"prompt": []}, False),
    ("gen-batch-rids", "POST", "/generate", {"prompt": ["a", "b"], "rid": ["x"]}, False),
    ("gen-batch-rid-twice", "POST", "/generate", {"prompt": ["a", "b"], "rid": ["x", "x"]}, False),
    ("gen-batch-item", "POST", "/generate", {"input_ids": [[1, 2], [1, 100]], "max_tokens": 1}, False),
    ("gen-batch-text-empty", "POST", "/generate", {"prompt": ["ab", ""], "max_tokens": 1}, False),
    ("gen-batch-text-start", "POST", "/generate", {"prompt": ["ab", "c"], "max_tokens": 0, "return_logprob": True,
                                                   "logprob_start_len": 0}, False),
    ("gen-batch-text-long", "POST", "/generate", {"prompt": ["ab", LONG], "max_tokens": 1}, False),
    ("gen-adapter-twice", "POST", "/generate", {"input_ids": IDS, "adapter": "a", "lora_path": "a"}, False),
    ("gen-adapter-unknown", "POST", "/generate", {"input_ids": IDS, "adapter": "nope"}, False),
    ("gen-lora-differ", "POST", "/generate", {"input_ids": [[1], [2]], "lora_path": ["a", "b"]}, False),
    ("gen-ids-mixed", "POST", "/generate", {"input_ids": IDS, "max_tokens": 0, "return_logprob": True,
                                            "logprob_start_len": 0, "token_ids_logprob": [1, [2]]}, False),
    ("gen-stop-stream", "POST", "/generate", {"input_ids": IDS, "stream": True, "max_tokens": -2}, False),
    ("gen-classifier", "POST", "/generate", {"input_ids": IDS}, True),
    # --- /generate, SGLang's shape
    ("sgl-fields-outside", "POST", "/generate", {"input_ids": IDS, "sampling_params": {}, "max_tokens": 0,
                                                 "temperature": 0}, False),
    ("sgl-text-and-prompt", "POST", "/generate", {"text": "ab", "prompt": "ab"}, False),
    ("sgl-frequency", "POST", "/generate", {"input_ids": IDS, "sampling_params": {"frequency_penalty": 0.5}}, False),
    ("sgl-regex", "POST", "/generate", {"input_ids": IDS, "sampling_params": {"regex": "a+"}}, False),
    ("sgl-max-tokens", "POST", "/generate", {"input_ids": IDS, "sampling_params": {"max_tokens": 3}}, False),
    ("sgl-hidden", "POST", "/generate", {"input_ids": IDS, "sampling_params": {}, "return_hidden_states": True},
     False),
    ("sgl-unknown", "POST", "/generate", {"input_ids": IDS, "sampling_params": {}, "return_logprobs": True}, False),
    ("sgl-nothing", "POST", "/generate", {"input_ids": IDS, "sampling_params": {"max_new_tokens": 0}}, False),
    ("sgl-start-past", "POST", "/generate", {"input_ids": IDS, "sampling_params": {}, "return_logprob": True,
                                             "logprob_start_len": 9}, False),
    ("sgl-sp-type", "POST", "/generate", {"input_ids": IDS, "sampling_params": {"temperature": "hot"}}, False),
    ("sgl-sp-range", "POST", "/generate", {"input_ids": IDS, "sampling_params": {"temperature": -1}}, False),
    ("sgl-empty-text", "POST", "/generate", {"text": "", "sampling_params": {}}, False),
    ("sgl-empty-ids", "POST", "/generate", {"input_ids": [], "sampling_params": {}}, False),
    ("sgl-oov", "POST", "/generate", {"input_ids": [1, 100], "sampling_params": {}}, False),
    ("sgl-long-text", "POST", "/generate", {"text": LONG, "sampling_params": {"max_new_tokens": 1}}, False),
    ("sgl-batch-long", "POST", "/generate", {"text": ["ab", LONG], "sampling_params": {"max_new_tokens": 1}},
     False),
    ("sgl-lora-differ", "POST", "/generate", {"text": ["a", "b"], "sampling_params": {}, "lora_path": ["a", "b"]},
     False),
    ("sgl-lora-unknown", "POST", "/generate", {"text": "a", "sampling_params": {}, "lora_path": "nope"}, False),
    ("sgl-image", "POST", "/generate", {"text": "a", "sampling_params": {}, "image_data": "data:x"}, False),
    ("sgl-stop-type", "POST", "/generate", {"text": "a", "sampling_params": {"stop": 3}}, False),
    ("sgl-classifier", "POST", "/generate", {"text": "a", "sampling_params": {}}, True),
    # --- /v1/completions
    ("cmp-not-json", "POST", "/v1/completions", "{", False),
    ("cmp-no-prompt", "POST", "/v1/completions", {"max_tokens": 1}, False),
    ("cmp-model", "POST", "/v1/completions", {"model": "other", "prompt": "a"}, False),
    ("cmp-empty", "POST", "/v1/completions", {"prompt": ""}, False),
    ("cmp-empty-list", "POST", "/v1/completions", {"prompt": []}, False),
    ("cmp-oov", "POST", "/v1/completions", {"prompt": [1, 100]}, False),
    ("cmp-long", "POST", "/v1/completions", {"prompt": LONG, "max_tokens": 1}, False),
    ("cmp-long-ids", "POST", "/v1/completions", {"prompt": [1] * 60, "max_tokens": 10}, False),
    ("cmp-logprobs", "POST", "/v1/completions", {"prompt": "a", "max_tokens": 1, "logprobs": 99}, False),
    ("cmp-neg-logprobs", "POST", "/v1/completions", {"prompt": "a", "logprobs": -1}, False),
    ("cmp-temperature", "POST", "/v1/completions", {"prompt": "a", "max_tokens": 1, "temperature": 5}, False),
    ("cmp-n", "POST", "/v1/completions", {"prompt": "a", "n": 2}, False),
    ("cmp-best-of", "POST", "/v1/completions", {"prompt": "a", "best_of": 2}, False),
    ("cmp-suffix", "POST", "/v1/completions", {"prompt": "a", "suffix": "b"}, False),
    ("cmp-penalty", "POST", "/v1/completions", {"prompt": "a", "presence_penalty": 1}, False),
    ("cmp-unknown", "POST", "/v1/completions", {"prompt": "a", "frobnicate": 1}, False),
    ("cmp-echo-zero", "POST", "/v1/completions", {"prompt": "a", "echo": True, "max_tokens": 0}, False),
    ("cmp-max-neg", "POST", "/v1/completions", {"prompt": "a", "max_tokens": -1}, False),
    ("cmp-stop-type", "POST", "/v1/completions", {"prompt": "a", "stop": 3}, False),
    ("cmp-stop-many", "POST", "/v1/completions", {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, False),
    ("cmp-ids-no-lp", "POST", "/v1/completions", {"prompt": IDS, "max_tokens": 1, "logprob_token_ids": [1]},
     False),
    ("cmp-ids-oov", "POST", "/v1/completions", {"prompt": IDS, "max_tokens": 1, "logprobs": 0,
                                                "logprob_token_ids": [10**6]}, False),
    ("cmp-prompt-logprobs", "POST", "/v1/completions", {"prompt": "ab", "prompt_logprobs": 99}, False),
    ("cmp-adapter", "POST", "/v1/completions", {"model": "nope-adapter", "prompt": "a"}, False),
    ("cmp-classifier", "POST", "/v1/completions", {"prompt": "a"}, True),
    # --- /v1/chat/completions
    ("chat-no-messages", "POST", "/v1/chat/completions", {"max_tokens": 1}, False),
    ("chat-empty", "POST", "/v1/chat/completions", {"messages": []}, False),
    ("chat-role", "POST", "/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, False),
    ("chat-model", "POST", "/v1/chat/completions", {"model": "other", "messages": MSG}, False),
    ("chat-top", "POST", "/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, False),
    ("chat-top-big", "POST", "/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 99},
     False),
    ("chat-n", "POST", "/v1/chat/completions", {"messages": MSG, "n": 3}, False),
    ("chat-temperature", "POST", "/v1/chat/completions", {"messages": MSG, "temperature": -0.5}, False),
    ("chat-long", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, False),
    ("chat-tools", "POST", "/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function"}]}, False),
    ("chat-image", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, False),
    ("chat-ids-no-lp", "POST", "/v1/chat/completions", {"messages": MSG, "logprob_token_ids": [1]}, False),
    ("chat-unknown", "POST", "/v1/chat/completions", {"messages": MSG, "frobnicate": 1}, False),
    ("chat-stop-type", "POST", "/v1/chat/completions", {"messages": MSG, "stop": {"a": 1}}, False),
    ("chat-classifier", "POST", "/v1/chat/completions", {"messages": MSG}, True),
    # --- /v1/score
    ("score-empty", "POST", "/v1/score", {}, False),
    ("score-no-items", "POST", "/v1/score", {**SCORE, "items": []}, False),
    ("score-no-labels", "POST", "/v1/score", {**SCORE, "label_token_ids": []}, False),
    ("score-oov-label", "POST", "/v1/score", {**SCORE, "label_token_ids": [100]}, False),
    ("score-mixed", "POST", "/v1/score", {**SCORE, "query": [1, 2], "items": ["a"]}, False),
    ("score-long", "POST", "/v1/score", {**SCORE, "query": LONG}, False),
    ("score-model", "POST", "/v1/score", {**SCORE, "model": "other"}, False),
    ("score-empty-query", "POST", "/v1/score", {**SCORE, "query": ""}, False),
    ("score-oov-ids", "POST", "/v1/score", {**SCORE, "query": [1, 100], "items": [[2]]}, False),
    ("score-classifier", "POST", "/v1/score", SCORE, True),
    # --- /classify, /pooling
    ("cls-causal", "POST", "/classify", {"input": "a"}, False),
    ("cls-no-input", "POST", "/classify", {}, True),
    ("cls-both", "POST", "/classify", {"input": "a", "text": "b"}, True),
    ("cls-text-ids", "POST", "/classify", {"text": "a", "input_ids": [1]}, True),
    ("cls-empty", "POST", "/classify", {"input": []}, True),
    ("cls-empty-ids", "POST", "/classify", {"input_ids": []}, True),
    ("cls-oov", "POST", "/classify", {"input": [1, 100]}, True),
    ("cls-long", "POST", "/classify", {"input": LONG}, True),
    ("cls-rids", "POST", "/classify", {"text": ["a", "b"], "rid": ["x"]}, True),
    ("cls-model", "POST", "/classify", {"model": "other", "input": "a"}, True),
    ("cls-empty-text", "POST", "/classify", {"input": ""}, True),
    ("pool-causal", "POST", "/pooling", {"input": "a"}, False),
    ("pool-empty", "POST", "/pooling", {"input": []}, True),
    ("pool-oov", "POST", "/pooling", {"input": [[1, 100]]}, True),
    ("pool-wrong", "POST", "/pooling", {"input": 3}, True),
    # --- /inference/v1/generate (vLLM's token route)
    ("tok-no-ids", "POST", "/inference/v1/generate", {"sampling_params": {"max_tokens": 1}}, False),
    ("tok-empty", "POST", "/inference/v1/generate", {"token_ids": [], "sampling_params": {"max_tokens": 1}}, False),
    ("tok-oov", "POST", "/inference/v1/generate", {"token_ids": [1, 100], "sampling_params": {"max_tokens": 1}},
     False),
    ("tok-long", "POST", "/inference/v1/generate", {"token_ids": [1] * 60, "sampling_params": {"max_tokens": 10}},
     False),
    ("tok-penalty", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {
        "repetition_penalty": 1.3}}, False),
    ("tok-unknown-sp", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {
        "prompt_logprob": 1}}, False),
    ("tok-salt", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {"max_tokens": 1},
                                                    "cache_salt": "abc"}, False),
    ("tok-mode", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {"max_tokens": 1},
                                                    "output_mode": "text"}, False),
    ("tok-n", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {"n": 2}}, False),
    ("tok-lp-ids", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {
        "logprobs": 2, "logprob_token_ids": [1, 2, 3]}}, False),
    ("tok-rows", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {
        "prompt_logprob_token_ids": [[1]] * 3}}, False),
    ("tok-rows-stream", "POST", "/inference/v1/generate", {"token_ids": IDS, "stream": True, "sampling_params": {
        "prompt_logprob_token_ids": [[1]] * 5}}, False),
    ("tok-start", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {
        "prompt_logprob_start": 2}}, False),
    ("tok-max0", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {"max_tokens": 0}},
     False),
    ("tok-temperature", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {
        "temperature": 2.5}}, False),
    ("tok-prompt-lp", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {
        "prompt_logprobs": 10**6}}, False),
    ("tok-stop", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {"stop": 3}}, False),
    ("tok-adapter", "POST", "/inference/v1/generate", {"token_ids": IDS, "model": "nope",
                                                       "sampling_params": {"max_tokens": 1}}, False),
    ("tok-classifier", "POST", "/inference/v1/generate", {"token_ids": IDS, "sampling_params": {}}, True),
    ("tok-abort", "POST", "/inference/v1/abort_requests", {}, False),
    # --- tokenizer routes
    ("tokenize-empty", "POST", "/tokenize", {}, False),
    ("tokenize-model", "POST", "/tokenize", {"model": "other", "prompt": "a"}, False),
    ("tokenize-long", "POST", "/tokenize", {"prompt": "x" * 5000}, False),
    ("tokenize-both", "POST", "/tokenize", {"prompt": "a", "messages": MSG}, False),
    ("detok-empty", "POST", "/detokenize", {}, False),
    ("detok-oov", "POST", "/detokenize", {"tokens": [1, 100]}, False),
    ("detok-model", "POST", "/detokenize", {"model": "other", "tokens": [1]}, False),
    # --- admin routes
    ("weights-no-path", "POST", "/update_weights_from_disk", {}, False),
    ("weights-missing", "POST", "/update_weights_from_disk", {"model_path": "/nonexistent/x"}, False),
    ("load-missing", "POST", "/v1/load_lora_adapter", {}, False),
    ("load-twice", "POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}, False),
    ("unload-unknown", "POST", "/v1/unload_lora_adapter", {"lora_name": "nope"}, False),
    ("sgl-load-missing", "POST", "/load_lora_adapter", {}, False),
    ("sgl-unload-unknown", "POST", "/unload_lora_adapter", {"lora_name": "nope"}, False),
    ("pause-mode", "POST", "/pause_generation", {"mode": "sideways"}, False),
    ("abort-req", "POST", "/abort_request", {"rid": 3}, False),
    ("rl-pause", "POST", "/pause", "{", False),
    ("rl-abort", "POST", "/abort_requests", {}, False),
    ("no-route", "GET", "/nope", None, False),
    ("wrong-method", "GET", "/generate", None, False),
    ("wrong-method-openai", "GET", "/v1/completions", None, False),
]


ADMIN = "golden-admin-key"


async def _answers() -> dict[str, list[Any]]:
    """Each case's (status, body) as the ingress answers it now; a case that answers 2xx is recorded too (so a
    body the refactor started to refuse, or to accept, shows). One app per model (the fake keeps no state a 4xx
    changes, but the adapter registry: `load-twice` loads first)."""
    clients = {}
    for classifier in (False, True):
        backend = Backend()
        backend.info = CLASSIFIER if classifier else INFO
        app = build_fastapi_app(backend, IngressSettings(admin_api_keys=(ADMIN,)))
        clients[classifier] = (backend, httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                         base_url="http://test"))
    out: dict[str, list[Any]] = {}
    try:
        for name, method, path, body, classifier in CASES:
            backend, c = clients[classifier]
            if name == "load-twice":
                await backend.load_adapter("a", "/x")
            headers = {"authorization": f"Bearer {ADMIN}"}
            if isinstance(body, str):
                resp = await c.request(method, path, content=body,
                                       headers={**headers, "content-type": "application/json"})
            else:
                resp = await c.request(method, path, json=body, headers=headers)
            out[name] = [resp.status_code, resp.text if resp.status_code >= 400 else "2xx"]
            if name == "load-twice":
                await backend.unload_adapter("a")
    finally:
        for _, c in clients.values():
            await c.aclose()
    return out


async def test_every_route_answers_its_4xx_as_recorded() -> None:
    got = await _answers()
    if os.environ.get("RAYSCORE_GOLDEN_RECORD") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
        pytest.skip("recorded")
    want = json.loads(GOLDEN.read_text())
    assert list(got) == list(want), "the cases changed: record again"
    for name in want:
        assert got[name] == want[name], name


def test_the_cases_cover_every_route() -> None:
    """Every POST route of the app has a case (a new route adds its own)."""
    from fastapi.routing import APIRoute

    posts = {r.path for r in build_fastapi_app(Backend()).routes if isinstance(r, APIRoute) and "POST" in r.methods}
    covered = {path for _, _, path, _, _ in CASES}
    allowed = {"/flush_cache", "/continue_generation", "/resume"}  # no body, nothing a client can get wrong
    assert posts - covered - allowed == set()
