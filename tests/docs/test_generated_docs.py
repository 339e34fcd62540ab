"""The generated parts of docs/ against the code: docs/configuration.md's field table and shipped configs,
docs/api.md's list of messages, and docs/index.md (the README). A field, default, description, rule or message
changed in code and not regenerated (`python -m deploy.docs`) fails here; so does a field left out."""

from __future__ import annotations

import re

from deploy import docs
from deploy.config import AppConfig


def test_no_generated_page_is_stale() -> None:
    assert docs.stale(write=False) == [], "run `python -m deploy.docs` and commit docs/"


def test_the_config_table_has_every_field_once_with_its_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| [^|]* \| `[^`]*` \| `([^`]*)` \|", docs.config_table(), re.M)
    assert [name for name, _ in rows] == list(AppConfig.model_fields)
    stated = dict(rows)
    assert stated["max_request_bytes"] == str(AppConfig.model_fields["max_request_bytes"].default)
    assert stated["model_name"] == "null" and stated["weight_updates"] == "true"


def test_a_stale_section_is_found_and_rewritten() -> None:
    page = "a\n<!-- config:start -->\nold\n<!-- config:end -->\nb\n"
    new = docs.render(page, {"config": lambda: "new"})
    assert new == "a\n<!-- config:start -->\nnew\n<!-- config:end -->\nb\n"
    assert docs.render(new, {"config": lambda: "new"}) == new


def test_every_rulebook_message_is_listed() -> None:
    listed = docs.message_list()
    from rulebook import limits, rules
    for module in (rules, limits):
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str):
                assert f"`` {value} ``" in listed, name
    for rule in rules.SAMPLING_RULES:
        assert rule.text in listed, rule.field
