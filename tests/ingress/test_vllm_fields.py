"""vLLM's extensions of /v1/completions and /v1/chat/completions over the fake worker (tests/helpers/openai_fakes.py):
prompt_logprobs (its shape, its rules, its limits), return_token_ids, return_tokens_as_token_ids, the processed_logprobs
mode, and the fields the server refuses rather than drops (rulebook/openai_fields.py)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from ingress.app import build_fastapi_app
from ingress.openai.schemas.chat import ChatBody
from ingress.openai.schemas.completions import CompletionBody
from ingress.settings import IngressSettings
from rulebook import openai_fields
from tests.helpers.openai_fakes import INFO, Backend, call, complete, error, rank, sse, text_of, value

TRL_TEACHER = {"model": "tiny", "prompt": [[40, 41, 42, 43], [50, 51, 52]], "max_tokens": 1, "temperature": 0.7,
               "prompt_logprobs": 3}


def chat(body: dict, backend: Backend | None = None):  # noqa: ANN201
    return call(backend or Backend(), "POST", "/v1/chat/completions", body)


def entries(ids: list[int], k: int) -> list:
    """What the fake worker's prompt_logprobs are: the prompt token with its rank, then ids 0..k-1 ranked 1..k."""
    out: list = [None]
    for p in range(1, len(ids)):
        row = {str(ids[p]): {"logprob": value(p, ids[p]), "rank": rank(ids[p]), "decoded_token": text_of(ids[p])}}
        for j in range(k):
            row.setdefault(str(j), {"logprob": -0.001 * j, "rank": j + 1, "decoded_token": text_of(j)})
        out.append(row)
    return out


async def test_trl_teacher_request_gets_vllm_prompt_logprobs_per_choice():
    backend = Backend()
    resp = await complete(TRL_TEACHER, backend)
    assert resp.status_code == 200, resp.text
    choices = resp.json()["choices"]
    assert [c["prompt_logprobs"] for c in choices] == [entries([40, 41, 42, 43], 3), entries([50, 51, 52], 3)]
    assert all(c["logprobs"] is None for c in choices)  # prompt_logprobs alone asks for no completion logprobs
    for req in backend.requests:
        p = req.params
        assert (p.logprob_start_len, p.top_logprobs_num, p.return_input_ranks, p.return_logprob) == (0, 3, True, True)
        assert p.input_logprob_temperature is None  # raw_logprobs mode: prompt rows at T = 1


async def test_prompt_logprobs_zero_is_the_prompt_token_alone_and_keys_are_ordered():
    (choice,) = (await complete({**TRL_TEACHER, "prompt": [40, 41, 42], "prompt_logprobs": 0})).json()["choices"]
    assert choice["prompt_logprobs"] == entries([40, 41, 42], 0)
    # The prompt token first, then the top ones (TRL sorts by rank; vLLM's dict order is this one).
    (choice,) = (await complete({**TRL_TEACHER, "prompt": [40, 41], "prompt_logprobs": 2})).json()["choices"]
    assert list(choice["prompt_logprobs"][1]) == ["41", "0", "1"]


async def test_prompt_logprobs_of_a_one_token_prompt_is_one_null():
    (choice,) = (await complete({**TRL_TEACHER, "prompt": [40]})).json()["choices"]
    assert choice["prompt_logprobs"] == [None]


async def test_minus_one_is_the_whole_vocabulary_within_max_top_logprobs():
    """-1 is vLLM's whole vocabulary: the fake's 100 tokens are within the default max_top_logprobs (100)."""
    backend = Backend()
    (choice,) = (await complete({**TRL_TEACHER, "prompt": [40, 41], "prompt_logprobs": -1}, backend)).json()["choices"]
    assert backend.requests[0].params.top_logprobs_num == INFO.vocab_size
    assert len(choice["prompt_logprobs"][1]) == INFO.vocab_size  # the prompt token is one of them


async def test_prompt_logprobs_over_the_limits_is_a_400_naming_the_field():
    backend = Backend()
    backend.info = replace(INFO, vocab_size=1000)
    msg = error(await complete({**TRL_TEACHER, "prompt_logprobs": -1}, backend), 400, "prompt_logprobs")
    assert "1000 most likely tokens" in msg and "max_top_logprobs" in msg
    msg = error(await complete({**TRL_TEACHER, "prompt_logprobs": 101}), 400, "prompt_logprobs")
    assert "max_top_logprobs" in msg
    # Entries: rows x (1 + k) summed over the prompts (here 2 x (3 + 1) x 11 = 88), against max_logprob_entries.
    app = build_fastapi_app(backend, IngressSettings(max_logprob_entries=80))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        resp = await c.post("/v1/completions", json={**TRL_TEACHER, "prompt": [[1, 2, 3, 4]] * 2,
                                                     "prompt_logprobs": 10})
    assert "max_logprob_entries" in error(resp, 400, "prompt_logprobs")
    assert backend.requests == []


@pytest.mark.parametrize(("body", "message"), [
    ({"prompt_logprobs": -2}, openai_fields.PROMPT_LOGPROBS_NEGATIVE),
    ({"prompt_logprobs": 2, "stream": True}, openai_fields.PROMPT_LOGPROBS_STREAM),
    ({"prompt_logprobs": -1, "stream": True}, openai_fields.PROMPT_LOGPROBS_STREAM),
])
async def test_vllm_prompt_logprobs_rules(body: dict, message: str):
    assert error(await complete({**TRL_TEACHER, **body}), 400, "prompt_logprobs") == message
    assert error(await chat({"messages": [{"role": "user", "content": "hi"}], **body}), 400,
                 "prompt_logprobs") == message


async def test_prompt_logprobs_zero_with_a_stream_is_allowed_and_sends_none():
    resp = await complete({**TRL_TEACHER, "prompt": [40, 41], "prompt_logprobs": 0, "stream": True})
    events = sse(resp)
    assert all("prompt_logprobs" not in c for e in events for c in e["choices"])


async def test_echo_and_logprobs_alongside_keep_their_own_k():
    """logprobs=1 with echo and prompt_logprobs=3: one worker request as wide as the widest ask; each field keeps its
    own k (OpenAI's top_logprobs 1 + the actual token; vLLM's 3 + the prompt token)."""
    backend = Backend()
    body = {"model": "tiny", "prompt": [[40, 41, 42]], "max_tokens": 1, "logprobs": 1, "echo": True,
            "prompt_logprobs": 3}
    (choice,) = (await complete(body, backend)).json()["choices"]
    assert backend.requests[0].params.top_logprobs_num == 3
    assert choice["text"] == "HIJ" + "K"
    assert choice["logprobs"]["top_logprobs"][1] == {" ": -0.0, "I": value(1, 41)}  # k = 1, then the actual
    assert choice["prompt_logprobs"] == entries([40, 41, 42], 3)


async def test_return_token_ids_and_tokens_as_ids_on_completions():
    body = {"model": "tiny", "prompt": [[40, 41], [50]], "max_tokens": 2, "logprobs": 1,
            "return_token_ids": True, "return_tokens_as_token_ids": True}
    choices = (await complete(body)).json()["choices"]
    assert [c["prompt_token_ids"] for c in choices] == [[40, 41], [50]]
    assert [c["token_ids"] for c in choices] == [[42, 43], [51, 52]]
    assert choices[0]["logprobs"]["tokens"] == ["token_id:42", "token_id:43"]
    assert choices[0]["logprobs"]["top_logprobs"][0] == {"token_id:0": -0.0, "token_id:42": value(2, 42)}
    assert choices[0]["logprobs"]["text_offset"] == [0, len("token_id:42")]
    # Streamed: the prompt's ids in each choice's first chunk, the new ids in every chunk.
    events = sse(await complete({**body, "stream": True}))
    first_chunks = {}
    for e in events:
        for c in e["choices"]:
            first_chunks.setdefault(c["index"], c)
            assert "token_ids" in c
    assert first_chunks[0]["prompt_token_ids"] == [40, 41] and first_chunks[1]["prompt_token_ids"] == [50]
    # vLLM's echo with return_token_ids: the ids are the echo, the text is the completion's alone.
    (choice,) = (await complete({"model": "tiny", "prompt": [40, 41], "max_tokens": 1, "echo": True,
                                 "return_token_ids": True})).json()["choices"]
    assert choice["text"] == "J" and choice["prompt_token_ids"] == [40, 41]


async def test_chat_prompt_logprobs_and_token_ids_are_the_answers_own():
    backend = Backend()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt_logprobs": 2,
            "logprobs": True, "top_logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True}
    resp = await chat(body, backend)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    ids = backend.requests[0].input_ids
    assert out["prompt_token_ids"] == ids
    assert out["prompt_logprobs"] == entries(ids, 2)
    (choice,) = out["choices"]
    assert choice["token_ids"] == [ids[-1] + 1, ids[-1] + 2]
    first = choice["logprobs"]["content"][0]
    assert first["token"] == f"token_id:{ids[-1] + 1}" and [t["token"] for t in first["top_logprobs"]] == ["token_id:0"]


async def test_processed_logprobs_scores_the_prompt_at_the_request_temperature():
    backend = Backend()
    backend.info = replace(INFO, logprobs_mode="processed_logprobs")
    assert (await complete(TRL_TEACHER, backend)).status_code == 200
    assert {r.params.input_logprob_temperature for r in backend.requests} == {0.7}
    backend.requests.clear()
    await complete({**TRL_TEACHER, "temperature": 1.0}, backend)  # T = 1: the raw rows (the cached shortcut)
    assert {r.params.input_logprob_temperature for r in backend.requests} == {None}
    msg = error(await complete({**TRL_TEACHER, "top_p": 0.9}, backend), 400, "top_p")
    assert "processed_logprobs" in msg


@pytest.mark.parametrize(("field", "value"), [("repetition_penalty", 1.3), ("min_tokens", 2),
                                              ("bad_words", ["x"]), ("guided_json", {"a": 1}),
                                              ("use_beam_search", True), ("regex", "a+")])
async def test_a_known_field_that_changes_the_answer_is_refused_naming_it(field: str, value: object):
    for send in (complete, chat):
        body = {**TRL_TEACHER, field: value} if send is complete else {
            "messages": [{"role": "user", "content": "hi"}], field: value}
        msg = error(await send(body), 400, field)
        assert field in msg and "not supported" in msg


async def test_neutral_values_annotations_pass_and_unknown_fields_are_refused():
    neutral = {"repetition_penalty": 1.0, "min_tokens": 0, "use_beam_search": False, "user": "u",
               "metadata": {"run": "1"}, "request_id": "r", "add_special_tokens": False}
    assert (await complete({**TRL_TEACHER, **neutral})).status_code == 200
    assert (await chat({"messages": [{"role": "user", "content": "hi"}], **neutral})).status_code == 200
    msg = error(await complete({**TRL_TEACHER, "prompt_logprob": 3}), 400, "prompt_logprob")
    assert msg == openai_fields.UNKNOWN_FIELD.format(name="prompt_logprob")


def test_the_field_lists_cover_every_declared_field():
    """The bodies declare exactly the honoured fields plus the refused and annotation ones they type; the three lists
    are disjoint."""
    for body, honoured in ((CompletionBody, openai_fields.HONOURED_COMPLETIONS),
                           (ChatBody, openai_fields.HONOURED_CHAT)):
        declared = set(body.model_fields)
        assert set(honoured) <= declared
        later = declared - set(honoured)
        assert later <= set(openai_fields.REFUSED) | set(openai_fields.ANNOTATIONS), later
    lists = [set(openai_fields.HONOURED_COMPLETIONS) | set(openai_fields.HONOURED_CHAT),
             set(openai_fields.REFUSED), set(openai_fields.ANNOTATIONS)]
    assert not (lists[0] & lists[1]) and not (lists[0] & lists[2]) and not (lists[1] & lists[2])


def test_docs_name_every_field_of_the_lists():
    """docs/vllm.md's lists are the code's: every honoured, refused and annotation field is named there."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "vllm.md").read_text()
    names = {*openai_fields.HONOURED_COMPLETIONS, *openai_fields.HONOURED_CHAT, *openai_fields.REFUSED,
             *openai_fields.ANNOTATIONS}
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, missing


async def test_processed_logprobs_mode_still_serves_score_rows():
    """/v1/score's label rows are at T = 1 in either logprobs mode. (/generate's scoring keeps the contract's rule 9:
    it needs raw_logprobs or raw_logits, as SGLang's.)"""
    backend = Backend()
    backend.info = replace(INFO, logprobs_mode="processed_logprobs")
    score = {"query": [40, 41], "items": [[42]], "label_token_ids": [5]}
    assert (await call(backend, "POST", "/v1/score", score)).status_code == 200
