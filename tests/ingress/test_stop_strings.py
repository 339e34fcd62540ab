"""Stop strings on the real engine (in process, the embedded model): the ingress matches them in the text it decodes
and closes the worker call, which aborts the request in the engine; the answer ends at the token whose text
completed the stop string, streamed or not, with nothing the engine generated after it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.helpers.local_worker import client_of, engine_idle
from workers.worker import EngineWorker

IDS = [1, 504, 3458, 282, 2630, 28, 357, 1345, 314, 253, 1789, 30]
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def worker(smollm2_path: Path) -> EngineWorker:
    return EngineWorker({"model": str(smollm2_path), "dtype": "float32"})


async def _generate(worker: EngineWorker, **fields: Any) -> dict[str, Any]:
    body = {"input_ids": IDS, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "return_logprob": True,
            **fields}
    async with client_of(worker) as c:
        r = await c.post("/generate", json=body)
    assert r.status_code == 200, r.text
    if not fields.get("stream"):
        return r.json()
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return {"text": "".join(e["text"] for e in events), "output_ids": [t for e in events for t in e["output_ids"]],
            "meta_info": events[-1]["meta_info"],
            "rows": [row for e in events for row in e["meta_info"]["output_token_logprobs"]]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("include", [False, True])
async def test_a_stop_string_ends_the_answer_and_the_engine_request(worker: EngineWorker, smollm2_path: Path,
                                                                     stream: bool, include: bool) -> None:
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    free = await _generate(worker, max_tokens=12)
    ids = free["output_ids"]
    # A stop string across the boundary of the 5th and 6th tokens; the answer ends at the token that completes it.
    cut = len(tok.decode(ids[:5]))
    stop = free["text"][cut - 2:cut + 2]
    k = next(n for n in range(1, len(ids) + 1) if stop in tok.decode(ids[:n]))
    eng = worker.engine.engine
    steps = eng.counters.steps
    got = await _generate(worker, stop=[stop], include_stop_str_in_output=include, stream=stream)
    end = free["text"].find(stop) + (len(stop) if include else 0)
    assert got["text"] == free["text"][:end]
    assert got["output_ids"] == ids[:k]
    meta = got["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": stop}
    assert meta["completion_tokens"] == k
    rows = got["rows"] if stream else meta["output_token_logprobs"]
    assert rows == free["meta_info"]["output_token_logprobs"][:k]
    await engine_idle(worker)
    # Aborted, not run to max_tokens: the engine stepped a few times past the stop at most.
    assert eng.counters.steps - steps < k + 10 < MAX_TOKENS
