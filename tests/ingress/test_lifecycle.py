"""The request lifecycle's Exchange (one HTTP request's worker requests) without HTTP: N worker requests -> N
answers in order, chunks tagged with their request's position, a failure once bytes are out as a final `error`
chunk; and the one table of sampling rules that both APIs' validators share."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from ingress.errors import InvalidRequest, Unavailable
from ingress.generate.schemas import GenerateBody
from ingress.generate.validation import to_request, validate
from ingress.lifecycle import Exchange
from ingress.openai.completions import validate_completion
from ingress.openai.schemas.completions import CompletionBody
from protocol import GenerateRequest, SamplingParams
from tests.helpers.fakes import HANG, INFO, FakeBackend, fake_model


def request(rid: str, first_id: int, max_tokens: int, logprobs: bool = False) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=[first_id],
                           params=SamplingParams(max_tokens=max_tokens, return_logprob=logprobs))


async def test_collect_answers_in_request_order_whatever_finishes_first():
    exchange = Exchange(FakeBackend())
    exchange.open([request("long", 10, 5), request("short", 50, 1), request("mid", 70, 3)], INFO)
    await exchange.first_chunks()
    answers = await exchange.collect()
    assert [w.request_id for w in answers] == ["long", "short", "mid"]
    assert [w.new_token_ids for w in answers] == [[11, 12, 13, 14, 15], [51], [71, 72, 73]]
    assert all(w.finished for w in answers)


async def test_later_chunks_tag_each_chunk_with_its_request_and_ends_after_every_final_chunk():
    backend = FakeBackend(lambda req: [*fake_model(req), HANG])  # nothing may be read after a final chunk
    exchange = Exchange(backend)
    exchange.open([request("a", 10, 3), request("b", 50, 2)], INFO)
    first_chunks = await exchange.first_chunks()
    got: dict[int, list[int]] = {0: list(first_chunks[0].new_token_ids), 1: list(first_chunks[1].new_token_ids)}
    async with contextlib.aclosing(exchange.later_chunks()) as later:
        async for i, chunk in later:
            got[i] += chunk.new_token_ids
    assert got == {0: [11, 12, 13], 1: [51, 52]} and backend.aborted == []


async def test_a_stream_that_dies_mid_way_ends_with_an_error_chunk_that_keeps_none_and_empty():
    def dies(req):
        yield from list(fake_model(req))[:1]
        yield RuntimeError("actor died")

    exchange = Exchange(FakeBackend(dies))
    exchange.open([request("a", 10, 4, logprobs=True)], INFO)
    await exchange.first_chunks()
    async with contextlib.aclosing(exchange.later_chunks()) as later:
        (last,) = [chunk async for _, chunk in later]
    assert last.finished and last.finish_reason.type == "error" and "RuntimeError" in last.finish_reason.message
    assert last.output_token_logprobs == [] and last.input_token_logprobs is None
    assert last.completion_tokens == 1


async def test_a_failing_first_chunk_raises_and_closing_aborts_the_others():
    def first_dies(req):
        if req.rid == "a":
            raise RuntimeError("dead")
        yield HANG

    backend = FakeBackend(first_dies)
    exchange = Exchange(backend)
    exchange.open([request("a", 1, 2), request("b", 2, 2)], INFO)
    with pytest.raises(RuntimeError):
        await exchange.first_chunks()
    await exchange.aclose()
    assert backend.aborted == ["b"]


async def test_a_stream_without_a_final_chunk_is_unavailable():
    exchange = Exchange(FakeBackend(lambda req: list(fake_model(req))[:1]))
    exchange.open([request("a", 1, 3)], INFO)
    await exchange.first_chunks()
    with pytest.raises(Unavailable):
        await asyncio.wait_for(exchange.collect(), 5)


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 0.0), ("top_k", 10**30),
                                          ("min_p", 2.0), ("seed", -5), ("stop", ["x", ""]),
                                          ("stop_token_ids", [100])])
def test_both_apis_share_each_sampling_rule_and_its_text(field, value):
    with pytest.raises(InvalidRequest) as generate:
        validate(GenerateBody(input_ids=[1], **{field: value}), INFO)
    with pytest.raises(InvalidRequest) as completion:
        validate_completion(CompletionBody(prompt="A", **{field: value}), INFO)
    assert generate.value.message == completion.value.message
    assert completion.value.param == field


def test_generate_carrier_holds_one_sampling_params():
    req = to_request(GenerateBody(input_ids=[1], temperature=0.0, stop="x"))
    assert isinstance(req.params, SamplingParams) and req.params == SamplingParams(temperature=0.0, stop=["x"])
