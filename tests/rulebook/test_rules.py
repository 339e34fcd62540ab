"""The rulebook as pure functions: each rule's boundary and exact message, and that it imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from protocol.sampling import SamplingParams
from rulebook import rules


def test_prompt_rules_at_their_boundaries() -> None:
    assert rules.empty_ids([]) == rules.Violation("The input_ids must not be an empty list")
    assert rules.empty_ids([0]) is None
    assert rules.token_out_of_range([0, 319, 320, -1], 320) == rules.Violation(
        "Token id 320 is out of range for the vocabulary size 320.")
    assert rules.token_out_of_range([0, 319], 320) is None
    assert rules.context_too_long(500, 12, 512) is None
    assert rules.context_too_long(500, 13, 512) == rules.Violation(
        "The prompt length 500 plus max_tokens 13 exceeds the model's context length 512.")


def test_what_to_compute() -> None:
    assert rules.negative_max_tokens(-1) == rules.Violation("The max_tokens -1 must be non-negative.")
    assert rules.negative_max_tokens(0) is None
    assert rules.nothing_to_compute(0, scores_input=False) == rules.Violation(
        "The max_tokens 0 must be a positive integer.")
    assert rules.nothing_to_compute(0, scores_input=True) is None
    assert rules.start_past_end(1, 3) is None  # scores id 2
    assert rules.start_past_end(2, 3) == rules.Violation(
        "logprob_start_len(2) exceeds the last scorable source position for input_ids length(3).")
    assert rules.logprobs_disabled(True, "none") is not None
    assert rules.logprobs_disabled(False, "none") is None and rules.logprobs_disabled(True, "raw_logprobs") is None
    assert rules.negative_top_logprobs(-3) == rules.Violation("The top_logprobs_num -3 cannot be a negative integer.")
    assert rules.negative_top_logprobs(0) is None


def test_the_sampling_table_names_the_first_broken_field() -> None:
    assert rules.sampling_violation(SamplingParams(), 320) is None
    broken = rules.sampling_violation(SamplingParams(top_p=0.0, min_p=2.0), 320)
    assert broken == rules.Violation("The top_p 0.0 must be in (0, 1].", param="top_p")
    broken = rules.sampling_violation(SamplingParams(stop_token_ids=[1, 320]), 320)
    assert broken == rules.Violation("The stop_token_ids entry 320 is out of range for the vocabulary size 320.",
                                     param="stop_token_ids")
    assert rules.sampling_violation(SamplingParams(seed=rules.MAX_SEED), 320) is None
    assert rules.sampling_violation(SamplingParams(seed=rules.MAX_SEED + 1), 320).param == "seed"


def test_the_engine_and_the_ingress_answer_with_the_same_text(tiny_models) -> None:  # noqa: ANN001
    from engine.llm_engine import RequestError
    from ingress.errors import InvalidRequest, enforce
    from tests.helpers.engine import make_engine

    eng = make_engine(tiny_models["llama"])
    params = SamplingParams(max_tokens=4, top_k=10**6)
    with pytest.raises(RequestError) as engine_error:
        eng.add_request("x", [1, 2], params)
    with pytest.raises(InvalidRequest) as ingress_error:
        enforce(rules.sampling_violation(params, eng.vocab_size))
    expected = f"The top_k {10**6} must be -1 (disabled) or at most the vocabulary size 320."
    assert str(engine_error.value) == ingress_error.value.message == expected


def test_the_rulebook_imports_neither_torch_nor_the_web_framework_nor_ours() -> None:
    code = ("import sys, rulebook.rules;"
            "bad = [m for m in sys.modules if m.split('.')[0] in"
            " ('torch', 'fastapi', 'starlette', 'ray', 'engine', 'ingress', 'workers')];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
