"""An API key for tests, and the header that presents it."""

from __future__ import annotations

KEY = "sk-test-0123456789abcdef"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
