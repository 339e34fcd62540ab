"""SGLang's dialect of /generate over the fake worker: how a body is told apart, its normalization (batches, n,
per-prompt fields, rids), every refusal naming its field, and SGLang's answer (triples, entry 0 null, finish_reason,
cumulative stream). The real model's values are the e2e tier's (tests/e2e/test_sglang_served.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.openai_fakes import Backend, call, sse, text_of, value

IDS = [3, 4, 5, 6, 7]


async def gen(body: dict, backend: Backend | None = None):  # noqa: ANN201
    return await call(backend or Backend(), "POST", "/generate", body)


def row(pos: int, tok: int) -> list:
    return [value(pos, tok), tok, None]


async def test_slime_teacher_shape_scores_with_entry_zero_null() -> None:
    """slime's on-policy-distillation request (slime/rollout/on_policy_distillation.py), parsed by its indexing."""
    body = {"input_ids": IDS, "sampling_params": {"temperature": 0, "max_new_tokens": 0, "skip_special_tokens": False},
            "return_logprob": True, "logprob_start_len": 0}
    resp = await gen(body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    meta = out["meta_info"]
    assert out["text"] == "" and out["output_ids"] == []
    assert meta["input_token_logprobs"] == [[None, 3, None]] + [row(p, IDS[p]) for p in range(1, 5)]
    assert meta["output_token_logprobs"] == [] and "input_top_logprobs" not in meta
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 0 and meta["e2e_latency"] >= 0
    teacher = [item[0] for item in meta["input_token_logprobs"][1:]]  # slime's own parse
    assert teacher == [value(p, IDS[p]) for p in range(1, 5)]


async def test_lm_eval_shape_batched_with_generation() -> None:
    """lm-eval's sglang-generate loglikelihood request: a batch of id lists, max_new_tokens 1, top-1."""
    prompts = [IDS, [9, 8, 7]]
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "logprob_start_len": 0, "top_logprobs_num": 1, "return_logprob": True}
    answers = (await gen(body)).json()
    assert isinstance(answers, list) and len(answers) == 2
    for ids, out in zip(prompts, answers, strict=True):
        meta = out["meta_info"]
        assert [e[1] for e in meta["input_token_logprobs"]] == ids  # aligned with input_ids[0:]
        assert meta["input_token_logprobs"][0][0] is None and meta["input_top_logprobs"][0] is None
        assert len(meta["input_top_logprobs"]) == len(ids) and len(meta["input_top_logprobs"][1]) == 1
        assert out["output_ids"] == [ids[-1] + 1] and len(meta["output_token_logprobs"]) == 1
        ctxlen = 2  # lm-eval's parse_logprobs
        assert sum(x[0] for x in meta["input_token_logprobs"][ctxlen:]) == sum(
            value(p, ids[p]) for p in range(ctxlen, len(ids)))


async def test_text_prompt_is_tokenized_for_input_rows_and_texts_returned() -> None:
    body = {"text": "abc", "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
            "logprob_start_len": 1, "return_text_in_logprobs": True, "top_logprobs_num": 2}
    meta = (await gen(body)).json()["meta_info"]
    ids = [ord(c) - 32 for c in "abc"]
    assert meta["input_token_logprobs"] == [[None, ids[1], "b"], [value(2, ids[2]), ids[2], "c"]]
    assert [e[2] for e in meta["output_token_logprobs"]] == [text_of(ids[2] + 1), text_of(ids[2] + 2)]
    assert meta["input_top_logprobs"][1][0][2] == text_of(0)


async def test_default_start_returns_output_rows_only() -> None:
    body = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 3}, "return_logprob": True}
    meta = (await gen(body)).json()["meta_info"]
    assert meta["input_token_logprobs"] == [] and len(meta["output_token_logprobs"]) == 3
    assert meta["finish_reason"] == {"type": "length", "length": 3}


async def test_start_at_the_last_position_is_entry_zero_only() -> None:
    body = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
            "logprob_start_len": 4}
    meta = (await gen(body)).json()["meta_info"]
    assert meta["input_token_logprobs"] == [[None, 7, None]] and len(meta["output_token_logprobs"]) == 1


async def test_n_samples_a_single_prompt_as_a_list_with_own_ids() -> None:
    backend = Backend()
    resp = await gen({"input_ids": IDS, "rid": "r", "sampling_params": {"max_new_tokens": 1, "n": 3}}, backend)
    answers = resp.json()
    assert len(answers) == 3 and len({a["meta_info"]["id"] for a in answers}) == 3
    assert [r.rid for r in backend.requests] == ["r_0_0", "r_0_1", "r_0_2"]


async def test_sampling_fields_reach_the_worker() -> None:
    backend = Backend()
    sp = {"max_new_tokens": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 1 << 30, "min_p": 0.1, "stop": "x",
          "stop_token_ids": [5], "ignore_eos": True, "skip_special_tokens": False, "no_stop_trim": True,
          "sampling_seed": 7, "spaces_between_special_tokens": False, "frequency_penalty": 0.0}
    assert (await gen({"input_ids": IDS, "sampling_params": sp}, backend)).status_code == 200
    p = backend.requests[0].params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.stop, p.stop_token_ids) == (
        2, 0.5, 0.9, -1, 0.1, ["x"], [5])
    assert p.ignore_eos and not p.skip_special_tokens and p.include_stop_str_in_output and p.seed == 7


@pytest.mark.parametrize(("body", "status", "names"), [
    ({"input_ids": IDS, "sampling_params": {}, "max_tokens": 0, "temperature": 0}, 400, "max_tokens, temperature"),
    ({"text": "ab", "prompt": "ab"}, 400, "prompt"),
    ({"input_ids": IDS, "sampling_params": {"frequency_penalty": 0.5}}, 400, "sampling_params.frequency_penalty"),
    ({"input_ids": IDS, "sampling_params": {"regex": "a+"}}, 400, "sampling_params.regex"),
    ({"input_ids": IDS, "sampling_params": {"max_tokens": 3}}, 400, "max_tokens is not a field"),
    ({"input_ids": IDS, "sampling_params": {}, "lora_path": "x"}, 400, "lora_path"),
    ({"input_ids": IDS, "sampling_params": {}, "return_hidden_states": True}, 400, "return_hidden_states"),
    ({"input_ids": IDS, "sampling_params": {}, "return_logprobs": True}, 400, "Unknown field `return_logprobs`"),
    ({"input_ids": IDS, "sampling_params": {}, "max_tokens_new": 3}, 400, "Unknown field `max_tokens_new`"),
    ({"input_ids": IDS, "sampling_params": {"max_new_tokens": 0}}, 400, "computes nothing"),
    ({"input_ids": IDS, "sampling_params": {}, "return_logprob": True, "logprob_start_len": 5}, 400,
     "past the prompt's last position 4"),
    ({"input_ids": IDS, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 1,
      "token_ids_logprob": [[1], [2]]}, 400, "has 2 lists, one per scored row, but the request scores 3 rows"),
    ({"input_ids": [IDS, IDS], "sampling_params": [{}]}, 400, "sampling_params list has 1 entries"),
    ({"input_ids": [IDS, IDS], "sampling_params": [{"n": 1}, {"n": 2}]}, 400, "the same for every prompt"),
    ({"input_ids": IDS, "sampling_params": {"max_new_tokens": -1}}, 400, "at least 0"),
    ({"input_ids": IDS, "sampling_params": {"temperature": -1}}, 400, "temperature"),
    ({"input_ids": list(range(70)), "sampling_params": {}}, 400, "exceeds the model's context length 64"),
    ({"text": "a" * 70, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 0}, 400,
     "exceeds the model"),
    ({"input_ids": [IDS, [1, 200]], "sampling_params": {}}, 400, "Item 1: Token id 200"),
    ({"input_ids": IDS, "sampling_params": {"temperature": "hot"}}, 422, "sampling_params"),
    ({"input_ids": IDS, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True, "logprob_start_len": 0,
      "token_ids_logprob": [[1]] * 4}, 400, "per-row lists belongs to the input rows only"),
])
async def test_refusals_name_the_field(body: dict, status: int, names: str) -> None:
    resp = await gen(body)
    assert resp.status_code == status, resp.text
    assert names in resp.text


async def test_stream_is_cumulative_and_ends_as_the_whole_answer() -> None:
    body = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 3}, "return_logprob": True,
            "logprob_start_len": 2, "rid": "s"}
    whole = (await gen(body)).json()
    events = sse(await gen({**body, "stream": True}))
    assert [len(e["output_ids"]) for e in events] == [1, 2, 3]
    assert all(e["meta_info"]["input_token_logprobs"] == whole["meta_info"]["input_token_logprobs"] for e in events)
    assert events[0]["meta_info"]["finish_reason"] is None and "e2e_latency" not in events[0]["meta_info"]
    last = events[-1]
    last["meta_info"].pop("e2e_latency")
    whole["meta_info"].pop("e2e_latency")
    assert last == whole


async def test_batch_stream_events_name_their_prompt() -> None:
    body = {"input_ids": [IDS, [1, 2]], "sampling_params": {"max_new_tokens": 2}, "stream": True}
    events = sse(await gen(body))
    assert sorted((e["index"], len(e["output_ids"])) for e in events) == [(0, 1), (0, 2), (1, 1), (1, 2)]


async def test_sglang_bookkeeping_fields_are_accepted() -> None:
    body = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 1}, "session_id": "s", "log_metrics": False,
            "data_parallel_rank": 0, "custom_labels": {"a": "b"}, "rid": "r-1"}
    resp = await gen(body)
    assert resp.status_code == 200, resp.text


async def test_seed_shape_is_unchanged_beside_the_dialect() -> None:
    resp = await gen({"input_ids": IDS, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0})
    assert resp.json()["meta_info"]["input_token_logprobs"] == [[value(p, IDS[p]), IDS[p]] for p in range(1, 5)]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 99), min_size=2, max_size=12), data=st.data())
def test_both_shapes_carry_the_same_values(ids: list[int], data: st.DataObject) -> None:
    """The same request in either shape: SGLang's input rows are the seed's with entry 0 null in front; tops and
    per-row token ids likewise; the ids, text and counts equal."""
    import asyncio

    start = data.draw(st.integers(0, len(ids) - 2))
    k = data.draw(st.integers(0, 3))
    cands = data.draw(st.lists(st.lists(st.integers(0, 99), max_size=3), min_size=len(ids) - start - 1,
                               max_size=len(ids) - start - 1))
    common = {"input_ids": ids, "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": k,
              "token_ids_logprob": cands}

    async def both() -> tuple[dict, dict]:
        seed = (await gen({**common, "max_tokens": 0})).json()
        sgl = (await gen({**common, "sampling_params": {"max_new_tokens": 0}})).json()
        return seed, sgl

    seed, sgl = asyncio.run(both())
    a, b = seed["meta_info"], sgl["meta_info"]
    assert b["input_token_logprobs"][0] == [None, ids[start], None]
    assert [r[:2] for r in b["input_token_logprobs"][1:]] == a["input_token_logprobs"]
    if k:
        assert b["input_top_logprobs"][0] is None
        assert [[e[:2] for e in r] for r in b["input_top_logprobs"][1:]] == a["input_top_logprobs"]
    assert [[e[:2] for e in r] if r else [] for r in b["input_token_ids_logprobs"][1:]] == a["input_token_ids_logprobs"]
    assert (b["prompt_tokens"], b["completion_tokens"], sgl["text"], sgl["output_ids"]) == (
        a["prompt_tokens"], a["completion_tokens"], seed["text"], seed["output_ids"])
    json.dumps(sgl)


async def test_max_new_tokens_is_bounded_by_the_context_left() -> None:
    """SGLang's scheduler rule: an explicit max_new_tokens is cut to the context left, null means up to it."""
    backend = Backend()
    await gen({"input_ids": IDS, "sampling_params": {"max_new_tokens": 100}}, backend)
    await gen({"input_ids": IDS, "sampling_params": {"max_new_tokens": None}}, backend)
    assert [r.params.max_tokens for r in backend.requests] == [59, 59]
