"""One module per workload; each has NAME and run(ctx) -> (rows, details). Ordered as the issue lists them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.lib.context import Context
from bench.lib.report import Row
from bench.workloads import generation, http, long_scoring, multiple_choice, short_scoring

Workload = Callable[[Context], tuple[list[Row], dict[str, Any]]]

# Short names for --workload (also accepted: the number, 1-5).
WORKLOADS: dict[str, tuple[str, Workload]] = {
    "long": (long_scoring.NAME, long_scoring.run),
    "short": (short_scoring.NAME, short_scoring.run),
    "mc": (multiple_choice.NAME, multiple_choice.run),
    "gen": (generation.NAME, generation.run),
    "http": (http.NAME, http.run),
}


def resolve(names: list[str] | None) -> list[str]:
    """Workload keys in the canonical order (http last: it starts Ray in this process)."""
    if not names:
        return list(WORKLOADS)
    keys = list(WORKLOADS)
    wanted = set()
    for n in names:
        if n.isdigit() and 1 <= int(n) <= len(keys):
            wanted.add(keys[int(n) - 1])
        elif n in WORKLOADS:
            wanted.add(n)
        else:
            raise SystemExit(f"unknown workload {n!r}: choose from {', '.join(keys)} (or 1-{len(keys)})")
    return [k for k in keys if k in wanted]
