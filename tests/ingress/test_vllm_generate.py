"""vLLM 0.32's POST /inference/v1/generate on the real engine (in process, the embedded model in float32): its
scoring fields against transformers (1e-4), vLLM's answer shapes (prompt_logprobs with flat_logprobs' row 0, the
compact prompt_token_id_logprobs with -1 pads at -inf, streamed chunks), and a 400 naming every field it does not
honour. The answers against vLLM itself: bench/serving/peer_vllm.py (make peer-vllm)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from tests.helpers.local_worker import local_client
from tests.helpers.reference import hf_logits

IDS = [1, 504, 3458, 282, 2630, 28, 357, 1345, 314, 253, 1789, 30]
ROUTE = "/inference/v1/generate"


@pytest.fixture(scope="module")
def client(smollm2_path: Path) -> httpx.AsyncClient:
    return local_client(smollm2_path)


@pytest.fixture(scope="module")
def logprobs(smollm2_path: Path) -> torch.Tensor:
    return torch.log_softmax(hf_logits(smollm2_path, IDS), -1)


def _npy(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def _rank(lp: torch.Tensor, token: int) -> int:
    return int((lp >= lp[token]).sum())


async def _post(client: httpx.AsyncClient, sp: dict, **body: object) -> httpx.Response:
    return await client.post(ROUTE, json={"token_ids": IDS, "sampling_params": sp, **body})


@pytest.mark.parametrize("k", [0, 5])
@pytest.mark.parametrize("flat", [False, True])
async def test_prompt_logprobs_are_transformers(client: httpx.AsyncClient, logprobs: torch.Tensor,
                                                smollm2_path: Path, k: int, flat: bool) -> None:
    # ignore_eos: a sampled end-of-text token would end it as "stop", not the "length" checked below.
    resp = await _post(client, {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": k,
                                "flat_logprobs": flat, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    rows = body["prompt_logprobs"]
    assert rows[0] == ({} if flat else None) and len(rows) == len(IDS)
    for p, row in enumerate(rows[1:]):
        lp = logprobs[p]
        token = IDS[p + 1]
        top = torch.topk(lp, k).indices.tolist() if k else []
        assert list(row)[0] == str(token) and set(row) == {str(t) for t in [token, *top]}
        for tid, entry in row.items():
            assert abs(entry["logprob"] - lp[int(tid)].item()) <= 1e-4
            assert entry["decoded_token"] == tok.decode([int(tid)])
        assert row[str(token)]["rank"] in (_rank(lp, token), *(i + 1 for i, t in enumerate(top) if t == token))
        assert [row[str(t)]["rank"] for t in top if t != token] == [i + 1 for i, t in enumerate(top) if t != token]
    choice = body["choices"][0]
    assert body["output_mode"] == "tokens" and len(choice["token_ids"]) == 1 and choice["finish_reason"] == "length"
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 1}]
    assert body["usage"]["prompt_tokens"] == len(IDS) and body["request_id"].startswith("generate-tokens-")


@pytest.mark.parametrize("with_prompt_logprobs", [False, True])
async def test_per_row_ids_with_padding(client: httpx.AsyncClient, logprobs: torch.Tensor,
                                        with_prompt_logprobs: bool) -> None:
    start = 3
    n = len(IDS) - 1 - start
    rows = [[IDS[start + i + 1], 17, -1, 300 + i] if i % 2 else [5, -1, IDS[start + i + 1]] for i in range(n)]
    sp = {"max_tokens": 1, "prompt_logprob_token_ids": rows, "prompt_logprob_start": start}
    if with_prompt_logprobs:
        sp["prompt_logprobs"] = 1
    resp = await _post(client, sp)
    assert resp.status_code == 200, resp.text
    scores = _npy(resp.json()["prompt_token_id_logprobs"])
    assert scores.dtype == np.float32 and scores.shape == (n, 4)
    for i, row in enumerate(rows):
        padded = row + [-1] * (4 - len(row))
        for c, tid in enumerate(padded):
            if tid < 0:
                assert scores[i, c] == -np.inf
            else:
                assert abs(scores[i, c] - logprobs[start + i, tid].item()) <= 1e-4


async def test_output_token_ids_and_logprobs(client: httpx.AsyncClient, logprobs: torch.Tensor) -> None:
    ids = [7, 42, 1000]
    resp = await _post(client, {"max_tokens": 1, "temperature": 0, "logprob_token_ids": ids, "logprobs": 3})
    assert resp.status_code == 200, resp.text
    (step,) = resp.json()["choices"][0]["logprobs"]["content"]
    lp = logprobs[len(IDS) - 1]
    assert step["token_id"] == int(lp.argmax()) and abs(step["logprob"] - lp.max().item()) <= 1e-4
    assert [e["token_id"] for e in step["top_logprobs"]] == [step["token_id"], *ids][:3]
    for e in step["top_logprobs"][1:]:
        assert abs(e["logprob"] - lp[e["token_id"]].item()) <= 1e-4
    resp = await _post(client, {"max_tokens": 1, "temperature": 0, "logprobs": 2})
    (step,) = resp.json()["choices"][0]["logprobs"]["content"]
    assert [e["token_id"] for e in step["top_logprobs"]] == torch.topk(lp, 2).indices.tolist()
    assert step["rank"] == 1


async def test_a_sampled_token_outside_the_top_k_has_its_rank_over_the_vocabulary(
        client: httpx.AsyncClient, logprobs: torch.Tensor) -> None:
    """vLLM ranks the sampled token over the whole row it was sampled from, in or out of the k most likely."""
    lp = logprobs[len(IDS) - 1]
    seen = set()
    for seed in range(40):
        resp = await _post(client, {"max_tokens": 1, "temperature": 1.0, "seed": seed, "logprobs": 1,
                                    "ignore_eos": True})
        (step,) = resp.json()["choices"][0]["logprobs"]["content"]
        assert step["rank"] == _rank(lp, step["token_id"]) and step["top_logprobs"][0]["rank"] == step["rank"]
        seen.add(step["rank"])
        if any(r > 1 for r in seen):
            break
    assert any(r > 1 for r in seen), seen  # some draw fell outside the top 1


async def test_stream(client: httpx.AsyncClient) -> None:
    resp = await _post(client, {"max_tokens": 3, "temperature": 0, "ignore_eos": True, "prompt_logprobs": 0},
                       stream=True, return_token_ids=True, stream_options={"include_usage": True})
    assert resp.status_code == 200
    events = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == IDS and "prompt_token_ids" not in chunks[1]
    assert "prompt_logprobs" not in chunks[0]  # vLLM's stream schema has no field for them
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks[:-1]) == 3
    assert [c["choices"][0]["weight_versions"] for c in chunks[:-1]][-1] == [{"version": "default", "start": 0,
                                                                               "end": 3}]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


async def test_per_row_prompt_ids_beside_fixed_output_ids(client: httpx.AsyncClient, logprobs: torch.Tensor) -> None:
    """prompt_logprob_token_ids score the prompt rows, logprob_token_ids each generated token, on one request."""
    rows = [[IDS[p + 1], 9] for p in range(len(IDS) - 1)]
    fixed = [7, 42]
    resp = await _post(client, {"max_tokens": 1, "temperature": 0, "prompt_logprob_token_ids": rows,
                                "logprob_token_ids": fixed, "logprobs": 2})
    assert resp.status_code == 200, resp.text
    scores = _npy(resp.json()["prompt_token_id_logprobs"])
    want = np.array([[logprobs[p, t].item() for t in row] for p, row in enumerate(rows)], dtype=np.float32)
    assert scores.shape == want.shape and np.abs(scores - want).max() <= 1e-4
    (step,) = resp.json()["choices"][0]["logprobs"]["content"]
    lp = logprobs[len(IDS) - 1]
    assert [e["token_id"] for e in step["top_logprobs"]] == [step["token_id"], *fixed][:2]
    assert abs(step["top_logprobs"][1]["logprob"] - lp[fixed[0]].item()) <= 1e-4


@pytest.mark.parametrize(("sp", "body", "param", "message"), [
    ({"repetition_penalty": 1.3}, {}, "sampling_params.repetition_penalty", "is not supported by this server"),
    ({"prompt_logprob": 1}, {}, "sampling_params.prompt_logprob", "Unknown field"),
    ({}, {"cache_salt": "abc"}, "cache_salt", "is not supported by this server"),
    ({}, {"output_mode": "text"}, "output_mode", "`output_mode`='text' is not supported"),
    ({"n": 2}, {}, "sampling_params.n", "one choice per prompt"),
    ({"logprobs": 2, "logprob_token_ids": [1, 2, 3]}, {}, "logprob_token_ids",
     "logprobs must equal len(logprob_token_ids)"),
    ({"prompt_logprob_token_ids": [[1]] * 3}, {}, "prompt_logprob_token_ids", "has 3 rows, but the prompt has 11"),
    ({"prompt_logprob_token_ids": [[1]] * 11}, {"stream": True}, "prompt_logprob_token_ids", "stream=true"),
    ({"prompt_logprob_start": 2}, {}, "prompt_logprob_start", "requires prompt_logprob_token_ids"),
    ({"max_tokens": 0}, {}, "max_tokens", "max_tokens must be at least 1, got 0."),
    ({"temperature": 2.5}, {}, "temperature", "temperature must be in [0, 2], got 2.5."),
    ({"prompt_logprobs": 10**6}, {}, "prompt_logprobs", "Requested prompt logprobs of 1000000, which is greater"),
])
async def test_refusals_name_the_field(client: httpx.AsyncClient, sp: dict, body: dict, param: str,
                                       message: str) -> None:
    resp = await _post(client, {"max_tokens": 1, **sp}, **body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and message in error["message"]


async def test_abort_requests_needs_ids(client: httpx.AsyncClient) -> None:
    resp = await client.post("/inference/v1/abort_requests", json={})
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "Missing 'request_ids' in request body"


async def test_logprob_token_ids_on_completions_and_chat(client: httpx.AsyncClient, logprobs: torch.Tensor,
                                                         smollm2_path: Path) -> None:
    """vLLM's logprob_token_ids on its OpenAI routes: each generated token's alternatives are itself then the ids."""
    ids = [7, 42, 1000]
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    lp = logprobs[len(IDS) - 1]
    resp = await client.post("/v1/completions", json={"prompt": IDS, "max_tokens": 1, "temperature": 0, "logprobs": 1,
                                                      "logprob_token_ids": ids})
    assert resp.status_code == 200, resp.text
    (top,) = resp.json()["choices"][0]["logprobs"]["top_logprobs"]
    first = int(lp.argmax())
    assert list(top) == [tok.decode([t]) for t in [first, *ids]]
    assert all(abs(v - lp[t].item()) <= 1e-4 for v, t in zip(top.values(), [first, *ids], strict=True))
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0, "logprobs": True,
            "logprob_token_ids": ids}
    resp = await client.post("/v1/chat/completions", json=chat)
    assert resp.status_code == 200, resp.text
    (step,) = resp.json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in step["top_logprobs"]][1:] == [tok.decode([t]) for t in ids]
    resp = await client.post("/v1/chat/completions", json={**chat, "logprobs": False})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "logprob_token_ids"
    resp = await client.post("/v1/completions", json={"prompt": IDS, "max_tokens": 1, "logprobs": 0,
                                                      "logprob_token_ids": [10**6]})
    assert resp.status_code == 400 and "out-of-vocab" in resp.json()["error"]["message"]
