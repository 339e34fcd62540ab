"""HandleBackend.streams over a fake DeploymentHandle (no Ray): the requests of one HTTP request are one
`generate_many` call, demultiplexed into one stream per request (ingress/transport/many_call.py) that reads as
`stream` does: the same chunks, the same translated errors in every stream still waiting, the call cancelled when
one is left early and not when all have ended."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ingress.errors import Overloaded, WorkerLost
from ingress.transport import HandleBackend
from protocol import FinishReason, GenerateRequest, RequestOutput, SamplingParams
from tests.helpers.fakes import HANG, INFO, FakeHandle, FakeMethod

A, B = GenerateRequest("a", input_ids=[1]), GenerateRequest("b", input_ids=[2])
END = FinishReason(type="length")


def _backend(folder: Path, *messages: object) -> tuple[HandleBackend, FakeHandle]:
    handle = FakeHandle()
    handle.model_info = FakeMethod([dataclasses.replace(INFO, model_path=str(folder), vocab_size=49152)])
    handle.options(stream=True).generate_many = FakeMethod(list(messages))  # type: ignore[attr-defined]
    return HandleBackend(handle), handle  # type: ignore[arg-type]


def _calls(handle: FakeHandle) -> list:
    return handle.options(stream=True).generate_many.responses  # type: ignore[attr-defined]


async def test_one_call_is_read_as_one_stream_per_request(smollm2_path: Path) -> None:
    backend, handle = _backend(smollm2_path,
                               [(0, RequestOutput("a", new_token_ids=[40])),
                                (1, RequestOutput("b", new_token_ids=[41]))],
                               [(1, RequestOutput("b", new_token_ids=[42], finished=True, finish_reason=END))],
                               [(0, RequestOutput("a", new_token_ids=[43], finished=True, finish_reason=END))])
    a, b = backend.streams([A, B])
    got_b = [c async for c in b]
    got_a = [c async for c in a]
    assert [c.new_token_ids for c in got_a] == [[40], [43]] and [c.new_token_ids for c in got_b] == [[41], [42]]
    assert "".join(c.text for c in got_a) == "8;"  # the text is made here, as `stream` makes it
    assert len(_calls(handle)) == 1 and not _calls(handle)[0].cancelled
    assert handle.options(stream=True).generate.responses == []


async def test_leaving_one_stream_early_cancels_the_call(smollm2_path: Path) -> None:
    backend, handle = _backend(smollm2_path, [(0, RequestOutput("a", new_token_ids=[40]))], HANG)
    a, b = backend.streams([A, B])
    assert (await anext(a)).new_token_ids == [40]
    await a.aclose()
    assert _calls(handle)[0].cancelled
    with pytest.raises(StopAsyncIteration):  # the call ended: b ends without its final chunk (WORKER_ENDED_EARLY)
        await anext(b)


@pytest.mark.parametrize("kind", ["died", "full"])
async def test_an_error_of_the_call_is_raised_translated_by_every_waiting_stream(smollm2_path: Path,
                                                                                kind: str) -> None:
    from ray.exceptions import ActorDiedError
    from ray.serve.exceptions import BackPressureError

    exc = ActorDiedError() if kind == "died" else BackPressureError(num_queued_requests=3, max_queued_requests=2)
    expected = WorkerLost if kind == "died" else Overloaded
    finished_a = [(0, RequestOutput("a", new_token_ids=[40], finished=True, finish_reason=END))]
    backend, _ = _backend(smollm2_path, finished_a, exc)
    a, b = backend.streams([A, B])
    with pytest.raises(expected):
        await anext(b)
    assert [c.new_token_ids for c in [c async for c in a]] == [[40]]  # a had finished: its answer stands


async def test_requests_with_stop_strings_keep_a_call_each(smollm2_path: Path) -> None:
    stopped = dataclasses.replace(A, params=SamplingParams(stop=[";"]))
    backend, handle = _backend(smollm2_path, [(0, RequestOutput("b", new_token_ids=[41], finished=True,
                                                                finish_reason=END))])
    streams = backend.streams([stopped, B, B])
    assert len(streams) == 3
    assert [c.new_token_ids for c in [c async for c in streams[1]]] == [[41]]
    assert len(_calls(handle)) == 1  # B and B together; `stopped` goes through `generate` when read
    await streams[0].aclose()
    await streams[2].aclose()
