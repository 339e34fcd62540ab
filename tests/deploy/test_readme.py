"""The README's configuration tables against the code: every field it names is an `args:` field, and every
default its Limits table states is that field's default in AppConfig (which takes it from EngineConfig and
IngressSettings), so a default changed in code and not in the README fails here."""

from __future__ import annotations

import re
from pathlib import Path

from deploy.config import AppConfig

README = Path(__file__).parents[2] / "README.md"
# Defaults the table states in words: the engine computes them when the field is unset.
IN_WORDS = {"long_prefill_token_threshold": "budget / 4"}


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n{title}\n")
    end = text.find("\n#", start + len(title) + 2)
    return text[start:end]


def stated(default: object) -> str:
    """A default as the README writes it: 4 MiB, 204,800, 600."""
    if isinstance(default, int) and default >= 2**20 and default % 2**20 == 0:
        return f"{default // 2**20} MiB"
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return f"{default:,}" if isinstance(default, int) else str(default)


def limits_rows() -> list[tuple[str, str]]:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section("### Limits"), re.M)
    assert len(rows) >= 10, rows  # the table was found and read
    return [(name, default.strip()) for name, default in rows]


def test_the_limits_table_states_the_code_defaults() -> None:
    fields = AppConfig.model_fields
    for name, default in limits_rows():
        assert name in fields, f"README names {name!r}, which is no AppConfig field"
        expected = IN_WORDS.get(name) or stated(fields[name].default)
        assert default == expected, f"README says {name} defaults to {default!r}; the code says {expected!r}"


def test_every_engine_knob_the_readme_names_is_a_field() -> None:
    knobs = section("## Configuration").split("Engine knobs:", 1)[1].split("### Limits", 1)[0]
    names = set(re.findall(r"`([a-z_]+)`", knobs)) - {"auto", "raw_logprobs", "raw_logits", "none", "model",
                                                       "processed_logprobs"}
    assert len(names) >= 10, names
    assert names <= set(AppConfig.model_fields), names - set(AppConfig.model_fields)


def test_a_changed_default_would_be_caught() -> None:
    # The check compares text: a default the README does not state reads differently.
    assert stated(4 * 2**20) == "4 MiB" and stated(204_800) == "204,800" and stated(600.0) == "600"
    assert stated(32768) != stated(32769)
