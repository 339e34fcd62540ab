"""The fields a body of the seed's /generate shape (LMDeploy's) may carry besides the ones it declares: which change
nothing and are accepted unused, which are refused unless neutral (refused.py), and the message for any other.

A field the body does not know is refused too: a typo such as `logprob_start` would otherwise vanish, and the
answer with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rulebook.refused import Refused, Why, refusal
from rulebook.rules import Violation

# LMDeploy's /generate (the shape's anchor) sends these; they label the request or change nothing this server computes
# (fast tokenizers decode special tokens' spacing the same either way), so they are accepted and unused.
NO_EFFECT_FIELDS = ("session_id", "spaces_between_special_tokens")
# LMDeploy's fields that would change the answer and are not implemented.
REFUSED: Mapping[str, Refused] = {
    "repetition_penalty": Refused(Why.PENALTY, (1, 1.0)),
    "return_routed_experts": Refused(Why.ROUTED_EXPERTS, (False,)),
}
UNKNOWN_FIELD = ("Unknown field `{name}`: /generate does not know it, and refuses it rather than ignore it "
                 "(docs/api.md lists the fields of both its shapes).")


def undeclared_field(name: str, value: Any) -> Violation | None:
    """A field the seed's /generate body does not declare: accepted if it changes nothing, refused unless neutral
    if it would, refused if unknown."""
    if name in NO_EFFECT_FIELDS:
        return None
    rule = REFUSED.get(name)
    if rule is None:
        return Violation(UNKNOWN_FIELD.format(name=name), param=name)
    return refusal(name, value, rule, "docs/api.md")
