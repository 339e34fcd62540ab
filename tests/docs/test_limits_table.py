"""docs/api.md's table of limits against the code: every field it names is an `args:` field, and every default it
states is that field's default in AppConfig (which takes it from EngineConfig and IngressSettings), so a default
changed in code and not in the docs fails here. (docs/configuration.md's table is generated: test_generated_docs.)"""

from __future__ import annotations

import re
from pathlib import Path

from deploy.config import AppConfig

API = Path(__file__).parents[2] / "docs" / "api.md"
# Defaults the table states in words: the engine computes them when the field is unset.
IN_WORDS = {"long_prefill_token_threshold": "budget / 4"}


def section(title: str) -> str:
    text = API.read_text()
    start = text.index(f"\n{title}\n")
    end = text.find("\n#", start + len(title) + 2)
    return text[start:end]


def stated(default: object, name: str = "max_request_bytes") -> str:
    """A default as the docs write it: 4 MiB (a byte count), 204,800, 600."""
    if name.endswith("_bytes") and isinstance(default, int) and default >= 2**20 and default % 2**20 == 0:
        return f"{default // 2**20} MiB"
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return f"{default:,}" if isinstance(default, int) else str(default)


def limits_rows() -> list[tuple[str, str]]:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section("## Errors and limits"), re.M)
    assert len(rows) >= 10, rows  # the table was found and read
    return [(name, default.strip()) for name, default in rows]


def test_the_limits_table_states_the_code_defaults() -> None:
    fields = AppConfig.model_fields
    for name, default in limits_rows():
        assert name in fields, f"docs/api.md names {name!r}, which is no AppConfig field"
        expected = IN_WORDS.get(name) or stated(fields[name].default, name)
        assert default == expected, f"docs/api.md says {name} defaults to {default!r}; the code says {expected!r}"


def test_a_changed_default_would_be_caught() -> None:
    # The check compares text: a default the docs do not state reads differently.
    assert stated(4 * 2**20) == "4 MiB" and stated(204_800) == "204,800" and stated(600.0) == "600"
    assert stated(32768) != stated(32769)
    assert stated(2**24, "max_image_pixels") == "16,777,216"  # a pixel count is no byte count
