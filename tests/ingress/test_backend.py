"""HandleBackend over a fake DeploymentHandle (no Ray): caching, cancellation, readiness; import hygiene."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ingress.transport import HandleBackend
from protocol import FinishReason, GenerateRequest, RequestOutput, SamplingParams
from tests.helpers.fakes import HANG, INFO, FakeHandle, FakeMethod


def chunks(n: int) -> list[RequestOutput]:
    out = [RequestOutput(request_id="r", new_token_ids=[i]) for i in range(n - 1)]
    return [
        *out,
        RequestOutput(request_id="r", new_token_ids=[n], finished=True, finish_reason=FinishReason(type="length")),
    ]


REQ = GenerateRequest(rid="r", input_ids=[1])


def _handle(folder: Path) -> FakeHandle:
    """A fake handle whose workers report a real model folder: the ingress decodes generated ids with its tokenizer."""
    handle = FakeHandle()
    handle.model_info = FakeMethod([dataclasses.replace(INFO, model_path=str(folder), vocab_size=49152)])
    return handle


async def test_model_info_is_cached_after_first_success():
    handle = FakeHandle()
    handle.model_info = FakeMethod([RuntimeError("no replica yet")], [INFO])
    backend = HandleBackend(handle)
    with pytest.raises(RuntimeError):
        await backend.model_info()
    assert await backend.model_info() == INFO
    assert await backend.model_info() == INFO
    assert len(handle.model_info.responses) == 2


async def test_model_info_is_asked_again_in_the_background_once_old(monkeypatch):
    """The workers' runtime limits (their user_config) reach the ingress: a copy older than MODEL_INFO_TTL_S is
    refreshed while the request goes on with the one held; a refresh that fails keeps it."""
    monkeypatch.setattr("ingress.transport.worker_client.MODEL_INFO_TTL_S", 0.0)
    newer = dataclasses.replace(INFO, max_top_logprobs=3)
    handle = FakeHandle()
    handle.model_info = FakeMethod([INFO], [RuntimeError("replica gone")], [newer])
    backend = HandleBackend(handle)
    assert await backend.model_info() == INFO
    assert await backend.model_info() == INFO  # the refresh runs meanwhile, and fails
    await asyncio.sleep(0.01)
    assert await backend.model_info() == INFO  # kept; this call starts the next refresh
    await asyncio.sleep(0.01)
    assert await backend.model_info() == newer
    assert len(handle.model_info.responses) >= 3


class _RouteSeen(FakeMethod):
    """model_info's method, noting the route of Serve's request context each call is made in."""

    def __init__(self) -> None:
        super().__init__([INFO])
        self.routes: list[str] = []

    def remote(self, *args):  # noqa: ANN201
        from ray.serve.context import _get_serve_request_context

        self.routes.append(_get_serve_request_context().route)
        return super().remote(*args)


async def test_refresh_and_warm_up_run_outside_the_request_context(monkeypatch):
    """Serve tags a handle call with the route of the request context it is made in: the refresh and the tokenizer
    warm-up are the replica's own traffic, so their calls carry no route and Serve's counters tell them from the
    request's one call (checks/serve_calls.py)."""
    from ray.serve.context import _set_request_context

    monkeypatch.setattr("ingress.transport.worker_client.MODEL_INFO_TTL_S", 0.0)
    handle = FakeHandle()
    handle.model_info = _RouteSeen()
    backend = HandleBackend(handle)
    _set_request_context(route="/v1/completions")
    await backend.model_info()  # the first: inline, the request waits for it
    await backend.model_info()  # starts a refresh
    await asyncio.sleep(0.01)
    assert handle.model_info.routes == ["/v1/completions", ""]
    backend._info = None
    backend.warm()
    await backend._warming
    assert handle.model_info.routes[2:] == [""]


async def test_stream_goes_through_the_streaming_handle_and_is_not_cancelled_when_complete(smollm2_path: Path):
    handle = _handle(smollm2_path)
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod(chunks(3))
    got = [c async for c in backend.stream(REQ)]
    assert [c.new_token_ids for c in got] == [[0], [1], [3]]
    assert handle.generate.responses == []  # not through the unary handle
    assert handle.options(stream=True).is_stream
    assert not handle.options(stream=True).generate.responses[0].cancelled


async def test_closing_the_stream_early_cancels_the_worker_call(smollm2_path: Path):
    handle = _handle(smollm2_path)
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod(chunks(5))
    stream = backend.stream(REQ)
    await anext(stream)
    await stream.aclose()
    assert handle.options(stream=True).generate.responses[0].cancelled


async def test_cancelling_the_consumer_cancels_the_worker_call(smollm2_path: Path):
    handle = _handle(smollm2_path)
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod([chunks(2)[0], HANG])

    async def consume():
        async for _ in backend.stream(REQ):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.options(stream=True).generate.responses[0].cancelled


async def test_worker_error_propagates_and_cancels(smollm2_path: Path):
    handle = _handle(smollm2_path)
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod([chunks(2)[0], RuntimeError("actor died")])
    with pytest.raises(RuntimeError):
        async for _ in backend.stream(REQ):
            pass
    assert handle.options(stream=True).generate.responses[0].cancelled


async def test_answers_are_one_unary_call_for_the_whole_batch(smollm2_path: Path):
    handle = _handle(smollm2_path)
    backend = HandleBackend(handle)
    answers = [chunks(1)[0], chunks(1)[0]]
    handle.generate_whole = FakeMethod([answers])
    assert await backend.answers([REQ, REQ]) == answers
    assert len(handle.generate_whole.responses) == 1  # one call, not one per request
    assert handle.options(stream=True).generate.responses == []  # and no stream
    assert not handle.generate_whole.responses[0].cancelled


async def test_cancelling_the_answers_cancels_the_worker_call():
    handle = FakeHandle()
    backend = HandleBackend(handle)
    handle.generate_whole = FakeMethod([HANG])
    task = asyncio.create_task(backend.answers([REQ]))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.generate_whole.responses[0].cancelled


async def test_answers_translate_a_lost_worker():
    from ray.exceptions import ActorDiedError

    from ingress.errors import WorkerLost

    handle = FakeHandle()
    handle.generate_whole = FakeMethod([ActorDiedError()])
    with pytest.raises(WorkerLost):
        await HandleBackend(handle).answers([REQ])


async def test_ready():
    handle = FakeHandle()
    assert await HandleBackend(handle).ready() is True
    handle.stats = FakeMethod([RuntimeError("dead")])
    assert await HandleBackend(handle).ready() is False
    handle.stats = FakeMethod([HANG])
    assert await HandleBackend(handle, ready_timeout_s=0.05).ready() is False
    assert handle.stats.responses[0].cancelled


def test_ingress_never_imports_the_engine():
    # No engine module at all (the shared vocabulary is protocol/'s), never torch.
    code = (
        "import sys, ingress.app, ingress.transport, ingress.deployment;"
        "bad = [m for m in sys.modules if m == 'engine' or m.startswith('engine.')"
        " or m == 'torch' or m.startswith('torch.')];"
        "assert not bad, bad;"
        "from ray.serve.deployment import Deployment;"
        "from ingress.deployment import Ingress;"
        "assert isinstance(Ingress, Deployment);"
        "assert hasattr(Ingress.func_or_class, '__serve_build_asgi_app__')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# "Hello world, this is a test." in SmolLM2's tokenizer: Hello| world|,| this| is| a| test|.
HELLO = [19556, 905, 28, 451, 314, 253, 1028, 30]


def _generated(pieces: list[list[int]]) -> list[RequestOutput]:
    """A worker's deltas of HELLO's ids in `pieces`, each id with a logprob row, ending at length."""
    out, n = [], 0
    for i, ids in enumerate(pieces):
        n += len(ids)
        last = i == len(pieces) - 1
        out.append(RequestOutput(request_id="s", new_token_ids=ids, output_token_logprobs=[[-0.5, t] for t in ids],
                                 completion_tokens=n, finished=last,
                                 finish_reason=FinishReason("length") if last else None))
    return out


STOPPED = GenerateRequest(rid="s", input_ids=[1], params=SamplingParams(max_tokens=8, stop=["ld, th"],
                                                                        return_logprob=True))


async def test_a_stop_string_ends_the_answer_at_its_token_and_cancels_the_worker_call(smollm2_path: Path):
    """The engine went on past the stop (the ingress matches it): its later ids never reach the answer."""
    handle = _handle(smollm2_path)
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod(_generated([HELLO[:1], HELLO[1:2], HELLO[2:5], HELLO[5:]]))
    got = [c async for c in backend.stream(STOPPED)]
    assert [c.new_token_ids for c in got] == [HELLO[:1], HELLO[1:2], HELLO[2:4]]
    assert "".join(c.text for c in got) == "Hello wor"
    last = got[-1]
    assert last.finished and last.finish_reason == FinishReason("stop", matched="ld, th")
    assert last.completion_tokens == 4 and last.output_token_logprobs == [[-0.5, t] for t in HELLO[2:4]]
    assert handle.options(stream=True).generate.responses[0].cancelled  # the abort path: the engine stops


async def test_answers_with_stop_strings_read_one_stream_each(smollm2_path: Path):
    handle = _handle(smollm2_path)
    backend = HandleBackend(handle)
    handle.options(stream=True).generate = FakeMethod(_generated([[t] for t in HELLO]))
    handle.generate_whole = FakeMethod([[_generated([HELLO])[0]]])
    plain = GenerateRequest(rid="p", input_ids=[1], params=SamplingParams(max_tokens=8))
    stopped, whole = await backend.answers([STOPPED, plain])
    assert stopped.new_token_ids == HELLO[:4] and stopped.text == "Hello wor" and stopped.completion_tokens == 4
    assert stopped.finish_reason == FinishReason("stop", matched="ld, th")
    assert whole.text == "Hello world, this is a test." and whole.new_token_ids == HELLO
    assert len(handle.options(stream=True).generate.responses) == 1 and len(handle.generate_whole.responses) == 1


async def test_answers_carry_the_model_info_version_and_a_different_one_refreshes():
    """No polling: an answer whose version is the copy's keeps it trusted past the TTL (no worker call of the
    ingress's own), and one whose version differs (a user_config change, a weight update) refreshes it at once."""
    info = dataclasses.replace(INFO, version="v1")
    newer = dataclasses.replace(INFO, max_top_logprobs=3, version="v2")
    handle = FakeHandle()
    handle.model_info = FakeMethod([info], [newer])
    v1, v2 = ([[RequestOutput(request_id="r", finished=True, info_version=v)]] for v in ("v1", "v2"))
    handle.generate_whole = FakeMethod(v1, v1, v1, v2)
    backend = HandleBackend(handle, model_info_ttl_s=0.05)
    assert await backend.model_info() == info
    for _ in range(3):  # past the TTL each time, but an answer confirmed the copy just before
        await asyncio.sleep(0.06)
        await backend.answers([dataclasses.replace(REQ, params=SamplingParams(max_tokens=0))])
        assert await backend.model_info() == info
    await asyncio.sleep(0.01)
    assert len(handle.model_info.responses) == 1  # no refresh while the answers confirm the copy
    await backend.answers([dataclasses.replace(REQ, params=SamplingParams(max_tokens=0))])  # tells v2
    await asyncio.sleep(0.01)
    assert len(handle.model_info.responses) == 2 and await backend.model_info() == newer


async def test_no_answer_for_longer_than_the_ttl_refreshes_in_the_background():
    """A copy no answer confirmed for model_info_ttl_s is asked again (an answer made without a version, as an
    older worker's, confirms nothing)."""
    info = dataclasses.replace(INFO, version="v1")
    handle = FakeHandle()
    handle.model_info = FakeMethod([info])
    handle.generate_whole = FakeMethod([[RequestOutput(request_id="r", finished=True)]])
    backend = HandleBackend(handle, model_info_ttl_s=0.05)
    await backend.model_info()
    await asyncio.sleep(0.06)
    await backend.answers([dataclasses.replace(REQ, params=SamplingParams(max_tokens=0))])
    await backend.model_info()
    await asyncio.sleep(0.01)
    assert len(handle.model_info.responses) == 2


def test_the_version_is_the_same_on_replicas_of_one_configuration_and_moves_with_a_change():
    """model_info_version: a digest of the info's fields (but each replica's own KV capacity) and the weights."""
    from protocol.info import model_info_version

    base = model_info_version(INFO, "default")
    assert base == model_info_version(dataclasses.replace(INFO, kv_capacity_tokens=12345), "default")
    assert base == model_info_version(dataclasses.replace(INFO, version="old"), "default")
    assert base != model_info_version(INFO, "step-2")
    assert base != model_info_version(dataclasses.replace(INFO, max_top_logprobs=3), "default")
