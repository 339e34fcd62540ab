"""One finish renderer (ingress/finish.py): each engine finish as every dialect writes it, field for field."""

from __future__ import annotations

from typing import Any

import pytest

from ingress.finish import openai_finish, seed_finish, sglang_finish, vllm_stop_reason
from protocol import FinishReason, RequestOutput

STOP_IDS = [7]


def chunk(finish: FinishReason | None, finished: bool = True) -> RequestOutput:
    return RequestOutput(request_id="r", finished=finished, finish_reason=finish, completion_tokens=3)


# finish -> (OpenAI's finish_reason, vLLM's stop_reason, the seed's meta_info.finish_reason, SGLang's)
CASES: list[tuple[FinishReason, str, Any, dict[str, Any], dict[str, Any]]] = [
    (FinishReason("length"), "length", None, {"type": "length"}, {"type": "length", "length": 3}),
    (FinishReason("stop", matched="\n\n"), "stop", "\n\n", {"type": "stop", "matched": "\n\n"},
     {"type": "stop", "matched": "\n\n"}),
    (FinishReason("stop", matched=7), "stop", 7, {"type": "stop", "matched": 7}, {"type": "stop", "matched": 7}),
    # The end-of-text token: not one the request named, so vLLM's stop_reason is null.
    (FinishReason("stop", matched=2), "stop", None, {"type": "stop", "matched": 2}, {"type": "stop", "matched": 2}),
    (FinishReason("stop"), "stop", None, {"type": "stop"}, {"type": "stop", "matched": None}),
    (FinishReason("abort"), "abort", None, {"type": "abort"}, {"type": "abort", "message": "Aborted."}),
    (FinishReason("abort", message="paused"), "abort", None, {"type": "abort", "message": "paused"},
     {"type": "abort", "message": "paused"}),
    (FinishReason("error", message="boom", code=503), "error", None, {"type": "error", "message": "boom"},
     {"type": "abort", "message": "boom", "status_code": 503}),
    (FinishReason("error", message="boom"), "error", None, {"type": "error", "message": "boom"},
     {"type": "abort", "message": "boom", "status_code": 500}),
]


@pytest.mark.parametrize(("finish", "openai", "stop_reason", "seed", "sglang"), CASES)
def test_each_dialect_writes_the_finish(finish: FinishReason, openai: str, stop_reason: Any, seed: dict[str, Any],
                                        sglang: dict[str, Any]) -> None:
    done = chunk(finish)
    assert openai_finish(done) == openai
    assert vllm_stop_reason(done, STOP_IDS) == stop_reason
    assert seed_finish(done) == seed
    assert sglang_finish(done) == sglang


def test_no_finish_is_null_in_every_dialect() -> None:
    for unfinished in (chunk(None, finished=False), chunk(None)):
        assert openai_finish(unfinished) is None and vllm_stop_reason(unfinished, STOP_IDS) is None
        assert seed_finish(unfinished) is None and sglang_finish(unfinished) is None
    # OpenAI's and SGLang's write a finish only on the chunk that finishes; the seed's writes the one it carries.
    early = chunk(FinishReason("length"), finished=False)
    assert openai_finish(early) is None and sglang_finish(early) is None and seed_finish(early) == {"type": "length"}
