"""Fan-out and field bounds: over each, a 400 naming its config field, in the route's
own error shape; at the bound, served."""

from __future__ import annotations

import pytest

from ingress.settings import IngressSettings
from tests.helpers.fakes import FakeBackend, client, post

S = IngressSettings()


@pytest.mark.parametrize(("body", "field"), [
    ({"input_ids": [[1, 2]] * (S.max_batch_items + 1), "max_tokens": 1}, "max_batch_items"),
    ({"input_ids": [1, 2], "max_tokens": 1, "stop": [f"s{i}" for i in range(S.max_stop_strings + 1)]},
     "max_stop_strings"),
    ({"input_ids": [1, 2], "max_tokens": 1, "stop": ["x" * (S.max_stop_string_chars + 1)]},
     "max_stop_string_chars"),
    ({"input_ids": [1, 2], "max_tokens": 1, "stop_token_ids": [1] * (S.max_stop_token_ids + 1)},
     "max_stop_token_ids"),
    ({"input_ids": [1, 2], "max_tokens": 1, "rid": "r" * (S.max_rid_chars + 1)}, "max_rid_chars"),
])
async def test_over_a_bound_is_a_400_naming_its_field(body: dict, field: str) -> None:
    resp = await post(FakeBackend(), body)
    assert resp.status_code == 400, resp.text
    assert f"(config field `{field}`)" in resp.text


async def test_at_the_bounds_is_served() -> None:
    body = {"input_ids": [[1, 2]] * S.max_batch_items, "max_tokens": 1,
            "stop": ["x" * S.max_stop_string_chars] + [f"s{i}" for i in range(S.max_stop_strings - 1)],
            "stop_token_ids": [1] * S.max_stop_token_ids}
    assert (await post(FakeBackend(), body)).status_code == 200


async def test_openai_fan_out_is_bounded_in_its_shape() -> None:
    async with client(FakeBackend()) as c:
        resp = await c.post("/v1/completions", json={"model": "tiny", "prompt": [[1, 2]] * 40,
                                                     "max_tokens": 1})
    assert resp.status_code == 400 and "`max_batch_items`" in resp.json()["error"]["message"]
