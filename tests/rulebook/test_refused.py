"""Refused fields (rulebook/refused.py): every dialect's table is judged by one function with one message, so each
refused field of each dialect is a 400 naming it at any value but its neutral ones, and every neutral value passes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from rulebook import generate_fields, openai_fields, sglang, vllm_generate
from rulebook.refused import REFUSED, Refused, neutral_text, refusal
from rulebook.rules import Violation

Check = Callable[[str, Any], Violation | None]

# Each dialect's table, the check its ingress calls for one field, the path the message names, and its page.
DIALECTS: dict[str, tuple[Mapping[str, Refused], Check, str, str]] = {
    "openai": (openai_fields.REFUSED, openai_fields.undeclared_field, "", "docs/vllm.md"),
    "seed": (generate_fields.REFUSED, generate_fields.undeclared_field, "", "docs/api.md"),
    "sglang": (sglang.UNSUPPORTED_FIELDS, lambda n, v: sglang.unsupported_field({n: v}), "", "docs/sglang.md"),
    "sglang-sampling": (sglang.UNSUPPORTED_SAMPLING, lambda n, v: sglang.unsupported_sampling({n: v}),
                        "sampling_params.", "docs/sglang.md"),
    "sglang-update": (sglang.UPDATE_REFUSED, lambda n, v: sglang.update_refusal({n: v}), "", "docs/api.md"),
    "vllm": (vllm_generate.REFUSED_BODY, lambda n, v: vllm_generate.field_violation(
        n, v, vllm_generate.HONOURED_BODY, vllm_generate.REFUSED_BODY), "", "docs/vllm.md"),
    "vllm-sampling": (vllm_generate.REFUSED_SAMPLING, lambda n, v: vllm_generate.field_violation(
        n, v, vllm_generate.HONOURED_SAMPLING, vllm_generate.REFUSED_SAMPLING, "sampling_params."),
        "sampling_params.", "docs/vllm.md"),
}


def test_the_message_names_the_field_why_and_neutral_values_and_quotes_a_prefix() -> None:
    rule = Refused("penalties are not implemented", (1, 1.0))
    broken = refusal("sampling_params.repetition_penalty", "A" * 100_000, rule, "docs/api.md")
    assert broken == Violation("`sampling_params.repetition_penalty`='" + "A" * 31 + "... is not supported by this "
                               "server: penalties are not implemented. Only null or 1 or 1.0 is accepted "
                               "(docs/api.md).", param="sampling_params.repetition_penalty")
    assert [refusal("f", v, rule, "d") for v in (None, 1, 1.0)] == [None] * 3
    # A bool is not the number it equals, nor a number the bool.
    assert refusal("f", True, rule, "d") is not None
    assert refusal("f", 1, Refused("w", (True,)), "d") is not None


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_every_refused_field_of_every_dialect_is_named_unless_neutral(dialect: str) -> None:
    table, check, where, doc = DIALECTS[dialect]
    assert table
    for name, rule in table.items():
        broken = check(name, "not-a-neutral-value")
        assert broken is not None and broken.param == f"{where}{name}", (name, broken)
        assert broken.message == REFUSED.format(name=f"{where}{name}", value="'not-a-neutral-value'", why=rule.why,
                                                neutral=neutral_text(rule.neutral), doc=doc)
        for value in (None, *rule.neutral):
            assert check(name, value) is None, (name, value)
