"""SGLang's token_ids_logprob_positions (PR #27421, carried on as #38119) on /generate, on the real engine in process:
one id list per input position, indexed by the target token's absolute position, equal to transformers (1e-4); and
its rules (mutually exclusive with the flat token_ids_logprob, single requests only, one list per position, none
where nothing is scored), each a 400 naming the field."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from tests.helpers.local_worker import local_client
from tests.helpers.reference import hf_logits

IDS = [1, 504, 3458, 282, 2630, 28, 357, 1345, 314, 253]


@pytest.fixture(scope="module")
def client(smollm2_path: Path) -> httpx.AsyncClient:
    return local_client(smollm2_path)


def _body(positions: object, start: int = 4, **extra: object) -> dict:
    return {"input_ids": IDS, "sampling_params": {"max_new_tokens": 0, "temperature": 0}, "return_logprob": True,
            "logprob_start_len": start, "token_ids_logprob_positions": positions, **extra}


async def test_positions_are_transformers(client: httpx.AsyncClient, smollm2_path: Path) -> None:
    start = 4
    positions = [[] for _ in range(start + 1)] + [[IDS[p], 17, 300 + p] if p % 2 else [5] for p in
                                                   range(start + 1, len(IDS))]
    resp = await client.post("/generate", json=_body(positions, start))
    assert resp.status_code == 200, resp.text
    rows = resp.json()["meta_info"]["input_token_ids_logprobs"]
    assert rows[0] is None and len(rows) == len(IDS) - start
    lp = torch.log_softmax(hf_logits(smollm2_path, IDS), -1)
    for p in range(start + 1, len(IDS)):  # position p's ids, predicted by row p - 1
        got = rows[p - start]
        assert [e[1] for e in got] == positions[p]
        assert max(abs(e[0] - lp[p - 1, e[1]].item()) for e in got) <= 1e-4


@pytest.mark.parametrize(("body", "message"), [
    (_body([[]] * 10, token_ids_logprob=[1]), "mutually exclusive"),
    ({**_body([[]] * 10), "input_ids": [IDS, IDS]}, "single request only"),
    (_body([[]] * 9), "has 9 lists; it needs one per input position (input_ids has 10)"),
    (_body([[]] * 4 + [[7]] + [[]] * 5), "token_ids_logprob_positions[4] is not empty"),
    (_body([[]] * 9 + [[7]], start=-1, return_logprob=False), "need return_logprob true and logprob_start_len >= 0"),
])
async def test_rules_name_the_field(client: httpx.AsyncClient, body: dict, message: str) -> None:
    resp = await client.post("/generate", json=body)
    assert resp.status_code == 400, resp.text
    assert message in resp.text and "token_ids_logprob_positions" in resp.text
