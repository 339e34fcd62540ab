"""A streamed request with several prompts on the real engine (in process, the embedded model): one `generate_many`
call carries them all, its deltas add up to the non-streamed answers, and a client that leaves mid-stream aborts
every request of the call in the engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ingress.app import build_fastapi_app
from ingress.transport import HandleBackend
from tests.helpers.fakes import RawCall
from tests.helpers.local_worker import LocalHandle, client_of, engine_idle
from workers.worker import EngineWorker

PROMPTS = [[1, 504, 3458, 282, 2630], [1, 504, 3458, 282, 357, 1345], [1, 1789, 30]]


@pytest.fixture(scope="module")
def worker(smollm2_path: Path) -> EngineWorker:
    return EngineWorker({"model": str(smollm2_path), "dtype": "float32"})


async def test_streamed_prompts_are_one_call_and_add_up_to_the_whole_answers(worker: EngineWorker) -> None:
    body: dict[str, Any] = {"prompt": PROMPTS, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                            "logprobs": 2}
    async with client_of(worker) as c:
        whole = await c.post("/v1/completions", json=body)
        assert whole.status_code == 200, whole.text
        calls = worker._stream_calls
        r = await c.post("/v1/completions", json={**body, "stream": True})
        assert r.status_code == 200, r.text
    assert worker._stream_calls == calls + 1
    n = len(PROMPTS)
    texts, tokens, lps = [""] * n, [[] for _ in range(n)], [[] for _ in range(n)]
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for ch in json.loads(line[6:])["choices"]:
                texts[ch["index"]] += ch["text"]
                tokens[ch["index"]] += (ch.get("logprobs") or {}).get("tokens") or []
                lps[ch["index"]] += (ch.get("logprobs") or {}).get("token_logprobs") or []
    answers = whole.json()["choices"]
    assert texts == [ch["text"] for ch in answers]
    assert tokens == [ch["logprobs"]["tokens"] for ch in answers]
    assert lps == [ch["logprobs"]["token_logprobs"] for ch in answers]
    assert all(len(t) == 6 for t in tokens)


async def test_a_client_that_leaves_mid_stream_aborts_every_request_of_the_call(worker: EngineWorker) -> None:
    app = build_fastapi_app(HandleBackend(LocalHandle(worker)))  # type: ignore[arg-type]
    body = {"prompt": PROMPTS, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    raw = RawCall(app, body)
    raw.scope["path"], raw.scope["raw_path"] = "/v1/completions", b"/v1/completions"
    eng = worker.engine.engine
    calls, steps = worker._stream_calls, eng.counters.steps
    task = raw.run()
    await asyncio.wait_for(raw.first_body.wait(), 60)
    assert len(eng.seqs) == len(PROMPTS)  # all three run, from one call
    assert worker._stream_calls == calls + 1
    raw.gone.set()
    await asyncio.wait_for(task, 30)
    await engine_idle(worker)
    assert worker.engine.stats().queued == 0
    # Aborted, not run to max_tokens.
    assert eng.counters.steps - steps < 200
