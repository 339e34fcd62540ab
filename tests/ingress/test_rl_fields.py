"""/generate's RL fields at the ingress: input_logprob_temperature and token_ids_logprob are validated with the
rulebook's messages (400 naming the field or the config field), carried to the worker, and rendered only when
asked. Their values are the engine's (tests/engine/test_rl_scoring.py, e2e)."""

from __future__ import annotations

import math

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.errors import InvalidRequest
from ingress.generate.render import chunk_json
from ingress.generate.schemas import GenerateBody
from ingress.generate.validation import to_request, validate
from ingress.limits import logprob_entries
from ingress.settings import IngressSettings
from protocol import GenerateRequest, RequestOutput, SamplingParams
from tests.helpers.fakes import INFO, FakeBackend

SCORE = {"input_ids": [1, 2, 3, 4], "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}


def message(**fields) -> str | None:
    try:
        validate(GenerateBody(**fields), INFO)
    except InvalidRequest as exc:
        return exc.message
    return None


@pytest.mark.parametrize("temp", [0.0, -0.5, -3.0, 1e-6, 1e-40, 1e-300])
def test_temperature_must_be_at_least_the_threshold(temp: float) -> None:
    assert message(**SCORE, input_logprob_temperature=temp) == (
        f"The input_logprob_temperature {temp} must be finite and at least 1e-05 (below, logits / T overflows "
        "float32).")


def test_temperature_edges_and_types() -> None:
    assert message(**SCORE, input_logprob_temperature=1e-5) is None
    assert message(**SCORE, input_logprob_temperature=7) is None  # an int is a float here
    for bad in (math.inf, math.nan, "0.7"):
        with pytest.raises(ValueError):  # the schema's 422: JSON has no inf/nan, a string is no number
            GenerateBody(**SCORE, input_logprob_temperature=bad)


def test_fields_need_input_scoring() -> None:
    gen = {"input_ids": [1, 2], "max_tokens": 3}
    assert message(**gen, input_logprob_temperature=0.7) == (
        "The input_logprob_temperature applies to input-token scoring rows only: it requires logprob_start_len >= 0 "
        "(and max_tokens=0).")
    assert "The token_ids_logprob applies" in message(**gen, token_ids_logprob=[1])


def test_token_ids_within_vocab() -> None:
    assert message(**SCORE, token_ids_logprob=[0, 99]) is None
    assert message(**SCORE, token_ids_logprob=[5, 100]) == (
        "The token_ids_logprob entry 100 is out of range for the vocabulary size 100.")
    assert message(**SCORE, token_ids_logprob=[-1]) == (
        "The token_ids_logprob entry -1 is out of range for the vocabulary size 100.")


def test_to_request_carries_them() -> None:
    p = to_request(GenerateBody(**SCORE, input_logprob_temperature=0.7, token_ids_logprob=[3, 9])).params
    assert (p.input_logprob_temperature, p.token_ids_logprob, p.score_temperature) == (0.7, [3, 9], 0.7)
    p = to_request(GenerateBody(**SCORE)).params
    assert (p.input_logprob_temperature, p.token_ids_logprob, p.score_temperature) == (None, None, 1.0)


def test_entries_count_token_ids_per_scored_row() -> None:
    req = GenerateRequest("a", input_ids=list(range(10)), params=SamplingParams(
        max_tokens=0, return_logprob=True, logprob_start_len=3, top_logprobs_num=4, token_ids_logprob=[1, 2, 3]))
    assert logprob_entries(req) == (10 - 3 - 1) * (5 + 3)


async def test_limits_name_their_config_fields() -> None:
    backend = FakeBackend()
    app = build_fastapi_app(backend, IngressSettings(max_token_ids_logprob=3, max_logprob_entries=12))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        ok = await c.post("/generate", json={**SCORE, "token_ids_logprob": [1, 2, 3]})  # 3 rows x (1 + 3)
        assert ok.status_code == 200, ok.text
        r = await c.post("/generate", json={**SCORE, "token_ids_logprob": [1, 2, 3, 4]})
        assert r.status_code == 400 and "max_token_ids_logprob" in r.json()["message"], r.text
        r = await c.post("/generate", json={**SCORE, "input_ids": [1, 2, 3, 4, 5], "token_ids_logprob": [1, 2, 3]})
        assert r.status_code == 400 and "max_logprob_entries" in r.json()["message"], r.text  # 4 rows x 4 = 16
        r = await c.post("/generate", json={**SCORE, "input_logprob_temperature": 0})
        assert r.status_code == 400 and "input_logprob_temperature" in r.json()["message"], r.text
    assert len(backend.requests) == 1


def test_rendered_only_when_asked() -> None:
    plain = chunk_json(RequestOutput("r", input_token_logprobs=[[-1.0, 3]]))["meta_info"]
    assert "input_token_ids_logprobs" not in plain and "input_logprob_temperature" not in plain
    asked = chunk_json(RequestOutput("r", input_token_logprobs=[[-1.0, 3]], input_token_ids_logprobs=[[[-2.0, 7]]],
                                     input_logprob_temperature=0.7))["meta_info"]
    assert asked["input_token_ids_logprobs"] == [[[-2.0, 7]]] and asked["input_logprob_temperature"] == 0.7
