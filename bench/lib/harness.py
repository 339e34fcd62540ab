"""What every workload shares: the run settings, alternating timed repetitions, a progress bar, small stats.

Timing rule (the machine is noisy): every compared side runs in the same invocation, the sides alternate
(forward order on even repetitions, reversed on odd ones), each side is warmed up once untimed, and a figure
is the median over the repetitions.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Settings:
    model: str  # checkpoint folder, or the embedded default model's name
    # "full" (the sizes), "quick" (every workload shrunk: minutes) or "smoke" (tiny: checks that the
    # harness runs; its figures mean nothing).
    mode: str
    reps: int
    threads: int
    use_llamacpp: bool
    http_concurrency: int
    # Per-repetition time a slow side may take before it is measured on a smaller input instead (seconds).
    slow_side_budget_s: float
    # Workload 5's parts: "short" (http_short.py), "stream" (http_stream.py), "prompts" (workload 2's prompts) or
    # "all".
    http_part: str = "all"
    # Workload 5's front door: Serve's Python proxy, HAProxy with the throughput-optimized data plane
    # (deploy/front_door.py), or "both", each in a process of its own (bench/workloads/http_doors.py).
    front_door: str = "python"

    def size(self, full: Any, quick: Any, smoke: Any) -> Any:
        return {"full": full, "quick": quick, "smoke": smoke}[self.mode]


@dataclass
class Side:
    """One contender. `run` is timed; `prepare` (untimed) runs before every call of `run`, e.g. to build a
    fresh engine so that no repetition finds the previous one's prompts in the prefix cache."""

    run: Callable[[], Any]
    prepare: Callable[[], None] | None = None


@dataclass
class Timings:
    seconds: dict[str, list[float]] = field(default_factory=dict)
    # What each side's untimed warm-up call returned (for correctness checks).
    warmup: dict[str, Any] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def rate(self, name: str, amount: float) -> float:
        """amount per second at the median time."""
        return amount / self.median(name)

    def noise(self, *names: str, threshold: float = 1.3) -> str:
        """A note when some side's slowest repetition took threshold x its fastest or more (other load on the
        machine): the medians, and so the ratio, are less certain."""
        spread = {n: max(self.seconds[n]) / min(self.seconds[n]) for n in names or self.seconds
                  if self.seconds[n] and min(self.seconds[n]) > 0}
        worst = max(spread, key=lambda n: spread[n], default=None)
        if worst is None or spread[worst] < threshold:
            return ""
        return f"noisy: {worst}'s repetitions varied {spread[worst]:.1f}x (other load on the machine)"

    def summary(self) -> dict[str, dict[str, float]]:
        return {n: {"min": min(v), "median": statistics.median(v), "max": max(v)}
                for n, v in self.seconds.items() if v}


class Progress:
    """tqdm on stderr when it is installed, else one rewritten stderr line."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done = total, desc, 0
        try:
            from tqdm import tqdm

            self._bar: Any = tqdm(total=total, desc=desc, file=sys.stderr, leave=True, dynamic_ncols=True)
        except ImportError:
            self._bar = None
            self._line("")

    def _line(self, note: str) -> None:
        sys.stderr.write(f"\r{self.desc}: {self.done}/{self.total} {note:<60}")
        sys.stderr.flush()

    def step(self, note: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(1)
        else:
            self._line(note)

    def note(self, note: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(note)
        else:
            self._line(note)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


def alternate(sides: dict[str, Side], reps: int, desc: str) -> Timings:
    """Warm each side up once, then time `reps` rounds of all sides in alternating order."""
    names = list(sides)
    bar = Progress(len(names) * (reps + 1), desc)
    out = Timings(seconds={n: [] for n in names})
    try:
        for name in names:
            side = sides[name]
            bar.note(f"warm-up {name}")
            if side.prepare:
                side.prepare()
            out.warmup[name] = side.run()
            bar.step(f"warm-up {name}")
        for r in range(reps):
            for name in names if r % 2 == 0 else names[::-1]:
                side = sides[name]
                if side.prepare:
                    side.prepare()
                bar.note(f"rep {r + 1}/{reps} {name}")
                t = time.perf_counter()
                side.run()
                dt = time.perf_counter() - t
                out.seconds[name].append(dt)
                bar.step(f"{name} {dt:.2f}s")
    finally:
        bar.close()
    return out


def time_once(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    res = fn()
    return time.perf_counter() - t, res


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1]."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def max_abs_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"row counts differ: {len(a)} vs {len(b)}")
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def max_abs_diff_requests(a: list[list[float]], b: list[list[float]]) -> float:
    """max_abs_diff over several requests' rows, paired request by request."""
    return max((max_abs_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)


def rss_kb(field_name: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field_name} not in /proc/self/status")
