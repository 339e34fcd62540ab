"""rayscore as TRL's distillation teacher, with the real client: TRL's `VLLMClient.get_sequence_logprobs` (pinned
trl==1.16.0) against the app served with `logprobs_mode: processed_logprobs`, as TRL's docs start vLLM, and inspect_ai's
way of asking for prompt logprobs on chat (the official openai client's `extra_body`). Every returned entry and the
actual-token column equal transformers' log_softmax(logits / T) within 1e-4.

TRL's VLLMClient refuses to be constructed unless the `vllm` package is importable, though nothing it does over HTTP
uses it (vllm is the server's package). This test stands in for that one import check (`is_vllm_available`); the
client's own constructor (GET /health, GET /v1/models), request and parsing run unmodified.
"""

from __future__ import annotations

import math

import pytest
import torch
from openai import OpenAI
from ray import serve

from tests.helpers.reference import hf_logits
from tests.helpers.serve import app_args, deploy, ids_of

vllm_client = pytest.importorskip("trl.generation.vllm_client")

APP = "teacher"
PREFIX = "/teacher"
ATOL = 1e-4


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    deploy(APP, PREFIX, app_args(num_workers=1, logprobs_mode="processed_logprobs"))
    yield serve_url + PREFIX
    serve.delete(APP)


@pytest.fixture(scope="module")
def teacher(url: str, monkeypatch_module):  # noqa: ANN201
    monkeypatch_module.setattr(vllm_client, "is_vllm_available", lambda *a, **k: True)
    return vllm_client.VLLMClient(base_url=url)


@pytest.fixture(scope="module")
def monkeypatch_module():  # noqa: ANN201
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("k", [5, 20])
def test_get_sequence_logprobs_equals_transformers(teacher, smollm2_path, temperature: float, k: int) -> None:  # noqa: ANN001
    sequences = [ids_of(24, 1), ids_of(17, 2)]
    prompt_lengths = [10, 5]
    out = teacher.get_sequence_logprobs(sequences, prompt_lengths, top_logprobs=k, temperature=temperature)
    assert teacher.model == "smollm2-135m-instruct"
    for i, (seq, start) in enumerate(zip(sequences, prompt_lengths, strict=True)):
        lp = torch.log_softmax(hf_logits(smollm2_path, seq) / temperature, dim=-1)
        assert len(out["logprobs"][i]) == len(seq) - start
        for j, pos in enumerate(range(start, len(seq))):
            row = lp[pos - 1]  # the distribution that predicts seq[pos]
            top_v, top_i = torch.topk(row, k)
            assert out["logprob_token_ids"][i][j] == top_i.tolist()
            assert max(abs(a - b) for a, b in zip(out["logprobs"][i][j], top_v.tolist(), strict=True)) <= ATOL
            (actual,) = out["actual_logprobs"][i][j]
            assert math.isfinite(actual) and abs(actual - row[seq[pos]].item()) <= ATOL
            assert out["actual_token_ids"][i][j] == [seq[pos]]


def test_chat_prompt_logprobs_through_the_openai_client(url: str, smollm2_path) -> None:  # noqa: ANN001
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 5, "return_token_ids": True})
    extra = out.model_extra or {}
    ids, rows = extra["prompt_token_ids"], extra["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(ids)
    lp = torch.log_softmax(hf_logits(smollm2_path, ids), dim=-1)  # temperature 0: the raw rows
    for pos in range(1, len(ids)):
        row = lp[pos - 1]
        got = rows[pos]
        own = got[str(ids[pos])]
        assert abs(own["logprob"] - row[ids[pos]].item()) <= ATOL
        assert own["rank"] == int((row >= row[ids[pos]]).sum())
        top_v, top_i = torch.topk(row, 5)
        for r, (v, t) in enumerate(zip(top_v.tolist(), top_i.tolist(), strict=True), start=1):
            assert abs(got[str(t)]["logprob"] - v) <= ATOL
            assert got[str(t)]["rank"] == r or t == ids[pos]
        assert len(got) in (5, 6)
