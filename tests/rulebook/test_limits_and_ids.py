"""The rules the ingress and the engine share beyond the contract's list: the limits (rulebook/limits.py), the
empty prompt, a request id in use and a request the KV cache can never hold; each at its boundary, exact text."""

from __future__ import annotations

from rulebook import limits, rules


def test_limits_at_their_boundaries() -> None:
    assert limits.top_logprobs_over(100, 100) is None
    assert limits.top_logprobs_over(101, 100) == rules.Violation(
        "The request asks for the 101 most likely tokens per position; this server returns at most 100 "
        "(config field `max_top_logprobs`).")
    assert limits.entries_over(60, 60) is None
    assert limits.entries_over(61, 60).message.startswith("The request would return 61 logprob entries")
    assert limits.fan_out_over(32, 32) is None and limits.fan_out_over(33, 32) is not None
    assert limits.field_over("number of stop strings", 17, 16, "max_stop_strings") == rules.Violation(
        "The request's number of stop strings is 17, above 16 (config field `max_stop_strings`).")
    assert limits.field_over("number of stop strings", 16, 16, "max_stop_strings") is None


def test_prompt_ids_and_kv() -> None:
    assert rules.empty_prompt("") == rules.Violation("The prompt must not be an empty string")
    assert rules.empty_prompt([]) == rules.Violation("The prompt must not be an empty string")
    assert rules.empty_prompt("a") is None and rules.empty_prompt([1]) is None
    assert rules.request_id_in_use("r", True) == rules.Violation("request id 'r' is already in use")
    assert rules.request_id_in_use("r", False) is None
    assert rules.kv_too_small(100, 28, 64, fits=False) == rules.Violation(
        "The prompt length 100 plus max_tokens 28 does not fit the KV cache of 64 tokens.")
    assert rules.kv_too_small(10, 2, 64, fits=True) is None
    assert rules.negative("logprobs", -2) == rules.Violation("The logprobs -2 must be non-negative.")
    assert rules.negative("logprobs", 0) is None
