"""The contract's 400 rules as a pure function: exact texts, exact order, boundaries; and to_request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ingress.errors import InvalidRequest
from ingress.generate.schemas import GenerateBody
from ingress.generate.validation import to_request, validate
from protocol import ModelInfo

INFO = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=256, logprobs_mode="raw_logprobs")
NO_LOGPROBS = ModelInfo(model_name="tiny", vocab_size=100, max_model_len=256, logprobs_mode="none")
PROCESSED = ModelInfo(
    model_name="tiny", vocab_size=100, max_model_len=256, logprobs_mode="processed_logprobs"
)

SCORE = {"input_ids": [1, 2, 3, 4], "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}


def message(info: ModelInfo = INFO, prompt_len: int | None = None, **fields) -> str | None:
    try:
        validate(GenerateBody(**fields), info, prompt_len)
    except InvalidRequest as exc:
        return exc.message
    return None


# --- each rule, exact text --------------------------------------------------------------------------


def test_valid_generation_and_scoring_pass():
    assert message(input_ids=[1, 2, 3]) is None
    assert message(prompt="hi") is None
    assert message(**SCORE) is None
    assert message(NO_LOGPROBS, input_ids=[1], return_logprob=False) is None


def test_rule1_negative_top_logprobs_num():
    assert (
        message(input_ids=[1], top_logprobs_num=-3) == "The top_logprobs_num -3 cannot be a negative integer."
    )


@pytest.mark.parametrize("rl", [None, False])
def test_rule2_top_logprobs_needs_return_logprob(rl):
    assert message(input_ids=[1], top_logprobs_num=2, return_logprob=rl) == (
        "top_logprobs_num requires return_logprob=True."
    )
    assert message(input_ids=[1], top_logprobs_num=0, return_logprob=rl) is None


def test_rule3_logprobs_mode_none():
    assert message(NO_LOGPROBS, input_ids=[1], return_logprob=True) == (
        "return_logprob(True) requested but not enabled logprobs_mode in engine configuration."
    )


@pytest.mark.parametrize("fields", [{}, {"prompt": "a", "input_ids": [1]}])
def test_rule4_exactly_one_prompt(fields):
    assert message(**fields) == "You must specify exactly one of prompt or input_ids"


def test_rule5_empty_prompt():
    assert message(prompt="") == "The prompt must not be an empty string"


def test_rule6_empty_input_ids():
    assert message(input_ids=[]) == "The input_ids must not be an empty list"


@pytest.mark.parametrize("image", ["data:...", [], {}, 0, False])
def test_rule7_image_data(image):
    assert message(input_ids=[1], image_data=image) == "image input is not supported by this server."


def test_rule8_negative_max_tokens():
    assert message(input_ids=[1], max_tokens=-1) == "The max_tokens -1 must be non-negative."


def test_rule9_scoring_needs_return_logprob():
    assert message(**{**SCORE, "return_logprob": None}) == "logprob_start_len requires return_logprob=True."


def test_rule9_scoring_needs_raw_mode():
    assert message(PROCESSED, **SCORE) == "logprob_start_len requires raw_logits or raw_logprobs mode."
    raw_logits = ModelInfo(model_name="t", vocab_size=100, max_model_len=256, logprobs_mode="raw_logits")
    assert message(raw_logits, **SCORE) is None


def test_rule9_scoring_needs_max_tokens_zero():
    assert message(**{**SCORE, "max_tokens": 1}) == "logprob_start_len requires max_tokens=0."


def test_rule9_scoring_needs_input_ids():
    body = {**SCORE, "input_ids": None, "prompt": "hello"}
    assert message(**body) == "logprob_start_len requires input_ids."


def test_rule9_boundary_must_leave_a_row():
    # L=4: N=2 scores ids[3]; N=3 scores nothing.
    assert message(**{**SCORE, "logprob_start_len": 2}) is None
    assert message(**{**SCORE, "logprob_start_len": 3}) == (
        "logprob_start_len(3) exceeds the last scorable source position for input_ids length(4)."
    )
    assert message(**{**SCORE, "input_ids": [5], "logprob_start_len": 0}) == (
        "logprob_start_len(0) exceeds the last scorable source position for input_ids length(1)."
    )
    assert message(**{**SCORE, "logprob_start_len": 10**30}) == (
        f"logprob_start_len({10**30}) exceeds the last scorable source position for input_ids length(4)."
    )


def test_rule9_max_tokens_zero_without_boundary():
    assert message(input_ids=[1], max_tokens=0) == "The max_tokens 0 must be a positive integer."
    assert (
        message(prompt="x", max_tokens=0, return_logprob=True)
        == "The max_tokens 0 must be a positive integer."
    )


@pytest.mark.parametrize("bad", [100, -1, 10**30])
def test_rule10_token_out_of_vocab(bad):
    assert message(input_ids=[1, bad, 2]) == f"Token id {bad} is out of range for the vocabulary size 100."


def test_rule10_names_first_bad_id_and_edges_pass():
    assert message(input_ids=[0, 99]) is None
    assert message(input_ids=[0, 200, -5]) == "Token id 200 is out of range for the vocabulary size 100."


def test_rule11_context_length():
    assert message(input_ids=[1] * 250, max_tokens=6) is None  # exactly the context: allowed
    assert message(input_ids=[1] * 250, max_tokens=7) == (
        "The prompt length 250 plus max_tokens 7 exceeds the model's context length 256."
    )
    assert message(input_ids=[1] * 5, max_tokens=10**30) == (
        f"The prompt length 5 plus max_tokens {10**30} exceeds the model's context length 256."
    )


def test_rule11_scoring_prompt_longer_than_context():
    ids = [1] * 257
    assert message(**{**SCORE, "input_ids": ids}) == (
        "The prompt length 257 plus max_tokens 0 exceeds the model's context length 256."
    )


def test_rule11_text_prompt_only_when_length_known():
    assert message(prompt="long", max_tokens=10**6) is None  # the worker checks after tokenizing
    assert message(prompt="long", prompt_len=250, max_tokens=7) == (
        "The prompt length 250 plus max_tokens 7 exceeds the model's context length 256."
    )


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"temperature": -0.5}, "The temperature -0.5 must be non-negative and finite."),
        ({"top_p": 0}, "The top_p 0.0 must be in (0, 1]."),
        ({"top_p": 1.5}, "The top_p 1.5 must be in (0, 1]."),
        ({"top_k": -2}, "The top_k -2 must be -1 (disabled) or at most the vocabulary size 100."),
        ({"top_k": 10**30}, f"The top_k {10**30} must be -1 (disabled) or at most the vocabulary size 100."),
        ({"min_p": -0.1}, "The min_p -0.1 must be in [0, 1]."),
        ({"min_p": 1.1}, "The min_p 1.1 must be in [0, 1]."),
        ({"seed": -1}, "The seed -1 must be in [0, 9223372036854775807]."),
        ({"seed": 10**30}, f"The seed {10**30} must be in [0, 9223372036854775807]."),
        (
            {"top_logprobs_num": 101, "return_logprob": True},
            "The top_logprobs_num 101 exceeds the vocabulary size 100.",
        ),
        ({"stop": ""}, "The stop strings must not be empty."),
        ({"stop": ["a", ""]}, "The stop strings must not be empty."),
        (
            {"stop_token_ids": [-1]},
            "The stop_token_ids entry -1 is out of range for the vocabulary size 100.",
        ),
        (
            {"stop_token_ids": [5, 100]},
            "The stop_token_ids entry 100 is out of range for the vocabulary size 100.",
        ),
    ],
)
def test_rule12_sampling_ranges(fields, text):
    assert message(input_ids=[1], **fields) == text


def test_rule12_edges_pass():
    ok = {"temperature": 0, "top_p": 1, "top_k": 0, "min_p": 1, "seed": 0, "stop_token_ids": [0, 99]}
    assert message(input_ids=[1], **ok) is None
    assert (
        message(input_ids=[1], top_k=100, min_p=0, stop=["x"], top_logprobs_num=100, return_logprob=True)
        is None
    )


# --- order: the first failing rule wins -------------------------------------------------------------


def test_order_rule2_before_rule4():
    # Fails 2 (top_logprobs_num without return_logprob) and 4 (no prompt at all).
    assert message(top_logprobs_num=3) == "top_logprobs_num requires return_logprob=True."


def test_order_rule1_before_everything():
    assert message(NO_LOGPROBS, top_logprobs_num=-1, return_logprob=True, image_data="x", max_tokens=-1) == (
        "The top_logprobs_num -1 cannot be a negative integer."
    )


def test_order_rule3_before_rule4():
    assert message(NO_LOGPROBS, return_logprob=True) == (
        "return_logprob(True) requested but not enabled logprobs_mode in engine configuration."
    )


def test_order_rules_5_to_8():
    assert message(prompt="", image_data="x", max_tokens=-1) == "The prompt must not be an empty string"
    assert message(input_ids=[], image_data="x", max_tokens=-1) == "The input_ids must not be an empty list"
    assert (
        message(input_ids=[1], image_data="x", max_tokens=-1)
        == "image input is not supported by this server."
    )
    assert message(input_ids=[500], max_tokens=-1) == "The max_tokens -1 must be non-negative."


def test_order_within_rule9():
    # Every sub-rule broken: the first one speaks, then the next once it is fixed.
    body = {"prompt": "x", "max_tokens": 3, "logprob_start_len": 5}
    assert message(PROCESSED, **body) == "logprob_start_len requires return_logprob=True."
    body["return_logprob"] = True
    assert message(PROCESSED, **body) == "logprob_start_len requires raw_logits or raw_logprobs mode."
    assert message(**body) == "logprob_start_len requires max_tokens=0."
    body["max_tokens"] = 0
    assert message(**body) == "logprob_start_len requires input_ids."


def test_order_rule9_before_10_11_12():
    body = {**SCORE, "input_ids": [500] * 300, "logprob_start_len": 299, "temperature": -1}
    assert message(**body) == (
        "logprob_start_len(299) exceeds the last scorable source position for input_ids length(300)."
    )
    body["logprob_start_len"] = 0
    assert message(**body) == "Token id 500 is out of range for the vocabulary size 100."
    body["input_ids"] = [1] * 300
    assert (
        message(**body) == "The prompt length 300 plus max_tokens 0 exceeds the model's context length 256."
    )
    body["input_ids"] = [1] * 4
    assert message(**body) == "The temperature -1.0 must be non-negative and finite."


def test_order_rule8_before_rule9():
    assert message(**{**SCORE, "max_tokens": -1}) == "The max_tokens -1 must be non-negative."


# --- 422 type errors are the schema's, not validate's ------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": "5"},
        {"max_tokens": 5.0},
        {"max_tokens": True},
        {"input_ids": [True]},
        {"input_ids": ["1"]},
        {"input_ids": 3},
        {"prompt": 3},
        {"stream": "true"},
        {"stream": 1},
        {"return_logprob": 1},
        {"logprob_start_len": -2},
        {"temperature": "0.5"},
        {"temperature": float("nan")},
        {"top_p": float("inf")},
        {"stop": [1]},
        {"rid": 5},
    ],
)
def test_type_errors_are_schema_errors(fields):
    with pytest.raises(ValidationError):
        GenerateBody(**fields)


def test_schema_defaults_and_extras():
    body = GenerateBody(input_ids=[1], some_future_field={"x": 1}, temperature=0)
    assert body.max_tokens == 128 and body.stream is False and body.return_logprob is None
    assert body.logprob_start_len == -1 and body.top_logprobs_num is None
    assert body.temperature == 0.0 and isinstance(body.temperature, float)
    assert not hasattr(body, "some_future_field")


# --- to_request ---------------------------------------------------------------------------------------


def test_to_request_defaults():
    req = to_request(GenerateBody(input_ids=[1, 2]))
    assert len(req.rid) == 32 and int(req.rid, 16) >= 0
    assert req.input_ids == [1, 2]
    p = req.params
    assert p.return_logprob is False and p.top_logprobs_num == 0 and p.logprob_start_len == -1
    assert p.stop == [] and p.stop_token_ids == [] and p.seed is None
    assert to_request(GenerateBody(input_ids=[1])).rid != req.rid


def test_to_request_copies_every_field():
    body = GenerateBody(
        prompt="hi",
        max_tokens=7,
        return_logprob=True,
        logprob_start_len=-1,
        top_logprobs_num=3,
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        seed=42,
        stop="END",
        stop_token_ids=[7, 8],
        ignore_eos=True,
        skip_special_tokens=False,
        include_stop_str_in_output=True,
        rid="my-id",
    )
    req = to_request(body, [72, 73])  # the text prompt's ids, tokenized by the route
    p = req.params
    assert (req.rid, req.input_ids, p.max_tokens) == ("my-id", [72, 73], 7)
    assert (p.return_logprob, p.top_logprobs_num, p.logprob_start_len) == (True, 3, -1)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (0.5, 0.9, 5, 0.1, 42)
    assert (p.stop, p.stop_token_ids) == (["END"], [7, 8])
    assert (p.ignore_eos, p.skip_special_tokens, p.include_stop_str_in_output) == (True, False, True)
    assert to_request(GenerateBody(prompt="x", stop=["a", "b"]), [88]).params.stop == ["a", "b"]
