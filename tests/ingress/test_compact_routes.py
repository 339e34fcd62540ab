"""The compact logprob encoding (protocol/compact.py) on every route that answers logprobs: the same request with
`return_flat_logprobs_b64` decodes to exactly the JSON answer's values and ids, bit for bit (float32 values are the
engine's; /v1/score's float64 probabilities stay float64). Over the fake worker (tests/helpers/openai_fakes.py), whose
values are not float32-representable, so the test's fake rounds them through float32 as the engine's are."""

from __future__ import annotations

import struct

import pytest

from protocol import GenerateRequest, compact
from tests.helpers.openai_fakes import Backend, call, complete, model


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_model(req: GenerateRequest):  # noqa: ANN201
    """The fake worker with float32 values, as the engine's (its rows come from float32 tensors)."""
    for chunk in model(req):
        for name in ("input_token_logprobs", "output_token_logprobs"):
            rows = getattr(chunk, name)
            if rows is not None:
                setattr(chunk, name, [[f32(v), t] for v, t in rows])
        for name in ("input_top_logprobs", "output_top_logprobs"):
            rows = getattr(chunk, name)
            if rows is not None:
                setattr(chunk, name, [[[f32(v), t] for v, t in row] for row in rows])
        yield chunk


def bits(values: list) -> list:
    return [struct.pack("<d", v) for v in values]


def test_pack_round_trip_is_bit_exact_and_little_endian():
    vals = [f32(-0.1), -0.0, f32(-1e-30), float("-inf"), f32(-9999.0)]
    assert bits(compact.unpack_values(compact.pack_values(vals))) == bits(vals)
    assert compact.pack_ids([1, 256]) == "AQAAAAABAAA="  # 1 and 256, int32 little-endian
    wide = [0.1, 1 / 3]  # float64 stays float64
    assert compact.unpack_values(compact.pack_values(wide, "float64"), "float64") == wide
    ragged = [[[f32(-0.5), 3], [f32(-1.5), 4]], [[f32(-2.0), 5]]]
    fields = compact.encode_top_rows("x", ragged)
    assert fields["x_shape"] == [2, 2] and compact.decode_top_rows(fields, "x") == ragged
    assert compact.encode_token_rows("y", None) == {"y_val_flat_b64": None}


@pytest.mark.parametrize(("body", "names"), [
    ({"input_ids": [40, 41, 42, 43, 44], "max_tokens": 0, "return_logprob": True, "logprob_start_len": 1,
      "top_logprobs_num": 2}, ("input_token_logprobs", "input_top_logprobs")),
    ({"input_ids": [40, 41], "max_tokens": 3, "return_logprob": True, "top_logprobs_num": 2},
     ("output_token_logprobs", "output_top_logprobs")),
])
async def test_generate_meta_info_round_trip(body: dict, names: tuple[str, str]):
    plain = (await call(Backend(f32_model), "POST", "/generate", body)).json()["meta_info"]
    flat = (await call(Backend(f32_model), "POST", "/generate", {**body, "return_flat_logprobs_b64": True})
            ).json()["meta_info"]
    rows, tops = names
    assert rows not in flat and tops not in flat
    assert compact.decode_token_rows(flat, rows) == plain[rows]
    assert bits([v for v, _ in compact.decode_token_rows(flat, rows)]) == bits([v for v, _ in plain[rows]])
    assert compact.decode_top_rows(flat, tops) == plain[tops]
    assert flat[f"{tops}_shape"] == [len(plain[tops]), 2]
    assert flat[f"{tops}_val_flat_b64_dtype"] == "float32" and flat[f"{tops}_idx_flat_b64_dtype"] == "int32"


async def test_completions_logprobs_and_prompt_logprobs_round_trip():
    body = {"model": "tiny", "prompt": [[40, 41, 42], [50, 51]], "max_tokens": 2, "logprobs": 2, "echo": True,
            "prompt_logprobs": 3}
    plain = (await complete(body, Backend(f32_model))).json()["choices"]
    flat = (await complete({**body, "return_flat_logprobs_b64": True}, Backend(f32_model))).json()["choices"]
    for p, f in zip(plain, flat, strict=True):
        lp = f["logprobs"]
        assert lp["token_logprobs_null_prefix"] == 1
        assert [v for v, _ in compact.decode_token_rows(lp, "token_logprobs")] == p["logprobs"]["token_logprobs"][1:]
        tops = compact.decode_top_rows(lp, "top_logprobs")
        assert [len(r) for r in tops] == [2] * (len(p["logprobs"]["top_logprobs"]) - 1)
        # vLLM's prompt_logprobs: each position's own entry and its top-k, ids and ranks included.
        pl = f["prompt_logprobs"]
        own = compact.decode_token_rows(pl, "prompt_logprobs")
        ranks = compact.unpack_ids(pl["prompt_logprobs_rank_flat_b64"])
        top = compact.decode_top_rows(pl, "prompt_top_logprobs")
        for pos, entry in enumerate(p["prompt_logprobs"][1:]):
            value, token = own[pos]
            assert entry[str(token)]["logprob"] == value and entry[str(token)]["rank"] == ranks[pos]
            for place, (v, t) in enumerate(top[pos], start=1):
                assert entry[str(t)]["logprob"] == v and (entry[str(t)]["rank"] == place or t == token)


async def test_chat_round_trip():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2,
            "prompt_logprobs": 1}
    plain = (await call(Backend(f32_model), "POST", "/v1/chat/completions", body)).json()
    flat = (await call(Backend(f32_model), "POST", "/v1/chat/completions",
                       {**body, "return_flat_logprobs_b64": True})).json()
    content = plain["choices"][0]["logprobs"]["content"]
    lp = flat["choices"][0]["logprobs"]
    assert [v for v, _ in compact.decode_token_rows(lp, "token_logprobs")] == [c["logprob"] for c in content]
    assert [[v for v, _ in row] for row in compact.decode_top_rows(lp, "top_logprobs")] == [
        [t["logprob"] for t in c["top_logprobs"]] for c in content]
    own = compact.decode_token_rows(flat["prompt_logprobs"], "prompt_logprobs")
    assert [e[str(t)]["logprob"] for e, (_, t) in zip(plain["prompt_logprobs"][1:], own, strict=True)] == [
        v for v, _ in own]


@pytest.mark.parametrize("apply_softmax", [False, True])
async def test_score_round_trip_in_float64(apply_softmax: bool):
    body = {"query": [40, 41], "items": [[42], [43, 44]], "label_token_ids": [5, 6, 7], "apply_softmax": apply_softmax}
    plain = (await call(Backend(), "POST", "/v1/score", body)).json()
    flat = (await call(Backend(), "POST", "/v1/score", {**body, "return_flat_logprobs_b64": True})).json()
    assert "scores" not in flat and flat["scores_shape"] == [2, 3] and flat["scores_val_flat_b64_dtype"] == "float64"
    values = compact.unpack_values(flat["scores_val_flat_b64"], "float64")
    assert bits(values) == bits([p for row in plain["scores"] for p in row])


async def test_sglang_shape_round_trip_keeps_entry_zero_as_null_prefix():
    """SGLang's answer (triples, entry 0 null) with the flag: each field decodes to the JSON's values and ids bit
    for bit, the leading null as `<field>_null_prefix` 1."""
    body = {"input_ids": [40, 41, 42, 43, 44], "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 1, "top_logprobs_num": 2}
    plain = (await call(Backend(f32_model), "POST", "/generate", body)).json()["meta_info"]
    flat = (await call(Backend(f32_model), "POST", "/generate", {**body, "return_flat_logprobs_b64": True})
            ).json()["meta_info"]
    for name in ("input_token_logprobs", "output_token_logprobs"):
        rows = plain[name]
        head = 1 if rows and rows[0][0] is None else 0
        assert name not in flat and flat.get(f"{name}_null_prefix", 0) == head
        got = compact.decode_token_rows(flat, name)
        assert [t for _, t in got] == [r[1] for r in rows[head:]]
        assert bits([v for v, _ in got]) == bits([r[0] for r in rows[head:]])
    assert flat["input_token_logprobs_null_prefix"] == 1
    for name in ("input_top_logprobs", "output_top_logprobs"):
        rows = plain[name]
        head = 1 if rows and rows[0] is None else 0
        got = compact.decode_top_rows(flat, name)
        assert [[t for _, t in r] for r in got] == [[e[1] for e in r] for r in rows[head:]]
        assert [bits([v for v, _ in r]) for r in got] == [bits([e[0] for e in r]) for r in rows[head:]]
