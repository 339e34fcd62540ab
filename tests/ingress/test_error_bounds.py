"""Error bodies are bounded: a body with 50,000 invalid items is answered with the first few
errors, each echo cut short, and a count of the rest, in both error shapes; small answers are unchanged."""

from __future__ import annotations

import re

from ingress.errors import MAX_ERROR_TEXT, MAX_REPORTED_ERRORS
from tests.helpers.fakes import FakeBackend, client, post


async def test_many_invalid_items_give_a_small_422() -> None:
    resp = await post(FakeBackend(), {"input_ids": [""] * 50000})
    assert resp.status_code == 422 and len(resp.content) < 4000
    detail = resp.json()["detail"]
    assert len(detail) == MAX_REPORTED_ERRORS + 1
    # pydantic reports each item once per branch of input_ids' union: at least 50,000 errors, 5 shown.
    assert detail[-1]["type"] == "too_many_errors" and re.fullmatch(r"and \d+ more errors", detail[-1]["msg"])
    assert int(detail[-1]["msg"].split()[1]) >= 50000 - MAX_REPORTED_ERRORS


async def test_a_large_invalid_value_is_not_echoed_whole() -> None:
    resp = await post(FakeBackend(), {"input_ids": [1], "stop": {"x": "y" * 100000}})
    assert resp.status_code == 422 and len(resp.content) < 4000
    assert all(len(str(e.get("input", ""))) <= MAX_ERROR_TEXT + 3 for e in resp.json()["detail"])


async def test_openai_shape_is_bounded_too() -> None:
    async with client(FakeBackend()) as c:
        resp = await c.post("/v1/completions", json={"model": "tiny", "prompt": [[""] * 50000]})
    assert resp.status_code == 422 and len(resp.content) < 4000
    assert re.search(r"body: and \d+ more errors$", resp.json()["error"]["message"])


async def test_one_error_is_reported_as_before() -> None:
    resp = await post(FakeBackend(), {"input_ids": [1], "stream": "yes"})
    detail = resp.json()["detail"]
    assert resp.status_code == 422 and len(detail) == 1 and detail[0]["loc"] == ["body", "stream"]
    assert detail[0]["input"] == "yes"
