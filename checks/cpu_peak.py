"""Peak bytes of CPU tensors alive during a call, from torch's own allocator: torch.profiler with
profile_memory=True records every allocation and free of the CPU allocator (kernels' internal buffers too) with its
size and time; the running sum of those sizes, in time order, peaks at the most the call held at once beyond what
was alive before it. No CUDA needed: the scoring chunk's bound (engine/runner/score_chunks.py) is measured on CPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def _walk(nodes: list[Any]) -> Iterator[Any]:
    for n in nodes:
        yield n
        yield from _walk(n.children)


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most bytes the CPU allocator held at once while fn ran, beyond what it held before (what fn returns is
    freed after the measure: only its peak counts)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocations = [n for n in _walk(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
                   if n.tag == torch._C._profiler._EventType.Allocation and n.extra_fields.device.type == "cpu"]
    live = peak = 0
    for n in sorted(allocations, key=lambda n: n.start_time_ns):
        live += n.extra_fields.alloc_size  # negative for a free
        peak = max(peak, live)
    return peak
