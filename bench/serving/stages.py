"""Where a served request's CPU goes inside each serving process, by stage: `py-spy record` samples of the proxy,
the ingress and the worker during one untimed repetition, each stack put in one stage, the process's CPU (psutil,
same repetition) split in proportion (the per-stage breakdown).

A stack's stage is the first rule that matches a frame, reading from the innermost frame out: pickling inside a
handle call counts as pickling, JSON inside rendering as rendering. A worker's engine thread is one stage whatever
it runs, its CPU read from its OS threads (torch's compute threads run native code py-spy never samples); the rest
of the worker is split by its other samples. Stacks parked in Ray's blocking task loop are a sleeping main thread
that py-spy cannot tell from a running one, and are dropped.

py-spy (pinned in the dev extras) needs ptrace rights on the replicas (root, or ptrace_scope 0); without them
the split is absent and the bench says why, the per-process figures stay.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench.lib.report import Row
from bench.serving import serving_cpu

T = TypeVar("T")

# (stage, fragments of a frame's "function (file:line)"): the first rule with a fragment in a frame, innermost frame
# first, names the stack's stage.
ENGINE_THREAD = "engine thread"
ENGINE_THREAD_OS_NAME = "rayscore-engine"  # engine/async_engine.py names it; torch's threads it starts inherit it
ENGINE_ROOT = "AsyncEngine._loop ("  # the engine thread's outermost rayscore frame
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("carrier pickling", ("pickle", "serialization.py", "msgpack", "cloudpickle")),
    ("metrics", ("ray/util/metrics.py", "edge/metrics.py", "workers/metrics.py", "metrics_utils.py",
                 "Metric._record")),
    ("JSON and rendering", ("json/", "render.py", "answer.py", "responses.py", "sse.py")),
    ("validation", ("validation.py", "schemas.py", "rulebook/", "pydantic", "lifecycle.py", "limits.py")),
    ("rayscore worker code", ("workers/worker.py", "protocol/carriers.py")),
    ("rayscore ingress code", ("ingress/",)),
    ("Serve routing and handle calls", ("serve/handle.py", "serve/_private/router.py", "request_router",
                                        "replica_result.py", "ray/actor.py", "proxy_response_generator.py",
                                        "_raylet", "ray/_private/worker.py", "serve/_private/replica.py",
                                        "proxy.py", "tracing_utils.py", "proxy_router.py")),
    ("HTTP server (uvicorn, ASGI)", ("uvicorn/", "h11/", "httptools", "starlette/", "fastapi/", "http_util.py")),
)
ROLES = ("proxy", "ingress", "worker")
_LINE = re.compile(r":\d+\)$")
OTHER = "other (asyncio, Python runtime)"
IDLE_LEAVES = ("Worker.main_loop (",)


@dataclass
class Split:
    """Samples per stage of one process; `share` turns them into fractions of its CPU."""

    samples: Counter[str] = field(default_factory=Counter)

    def share(self) -> dict[str, float]:
        total = sum(self.samples.values())
        return {k: v / total for k, v in self.samples.most_common()} if total else {}


def stage_of(stack: list[str]) -> str:
    """The stage of one stack (frames outermost first, as py-spy writes them)."""
    for frame in reversed(stack):
        for stage, fragments in RULES:
            if any(f in frame for f in fragments):
                return stage
    return OTHER


def parse_raw(text: str) -> Split:
    """py-spy's `--format raw` (collapsed stacks: "frame;frame;... count" a line) into samples per stage."""
    split = Split()
    for stack, count in _busy_stacks(text):
        # The engine thread is one stage whatever runs on top of it (model, sampler, carriers built there).
        if any(ENGINE_ROOT in frame for frame in stack):
            split.samples[ENGINE_THREAD] += count
        else:
            split.samples[stage_of(stack)] += count
    return split


def _busy_stacks(text: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw lines as (frames outermost first, samples), idle stacks left out."""
    for line in text.splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text.strip() or not count.isdigit():
            continue
        stack = stack_text.split(";")
        if not stack[-1].startswith(IDLE_LEAVES):
            yield stack, int(count)


def pyspy() -> str | None:
    """py-spy's path (next to this interpreter, as in .venv/bin, else on PATH), or None when it is not installed."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def hot_frames(text: str, n: int = 20) -> list[tuple[str, float]]:
    """py-spy's raw stacks -> the `n` frames found in the most samples (each counted once per stack, idle stacks
    dropped), with their share of the samples: where a process's time goes, finer than its stages."""
    counts: Counter[str] = Counter()
    total = 0
    for stack, count in _busy_stacks(text):
        total += count
        for frame in {_LINE.sub(")", f) for f in stack}:  # a function once, whatever line of it ran
            counts[frame] += count
    return [(frame, c / total) for frame, c in counts.most_common(n)] if total else []


def profiled(pids: dict[str, int], seconds: float, go: Callable[[], T], rate: int = 50, keep: Path | None = None
             ) -> tuple[T, dict[str, Split], str | None]:
    """go() while py-spy samples each process of `pids` (role -> pid) for up to `seconds`: (go's result, the split
    per role, None or why there is none). `keep`: a folder where each role's raw stacks are also written
    (`<role>.raw`, for `hot_frames`)."""
    exe = pyspy()
    if exe is None:
        return go(), {}, "py-spy is not installed (dev extras)"
    with tempfile.TemporaryDirectory() as tmp:
        procs = {role: subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", str(rate),
             "--format", "raw", "--nonblocking", "-o", str(Path(tmp) / f"{role}.raw")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for role, pid in pids.items()}
        try:
            result = go()
        finally:
            for p in procs.values():  # a profile ends at its duration; stop it early once go() is done
                if p.poll() is None:
                    p.send_signal(2)  # SIGINT: py-spy writes what it has
        errors: list[str] = []
        splits: dict[str, Split] = {}
        for role, p in procs.items():
            try:
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                err = "py-spy did not stop"
            out = Path(tmp) / f"{role}.raw"
            if out.exists():
                splits[role] = parse_raw(out.read_text())
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(out, keep / f"{role}.raw")
            else:
                errors.append(f"{role}: {(err or '').strip().splitlines()[-1:] or 'no output'}")
    return result, splits, ("; ".join(errors) or None)


def per_stage_ms(splits: dict[str, Split], ms: dict[str, float], engine_ms: float | None = None
                 ) -> dict[str, dict[str, float]]:
    """role -> stage -> CPU-ms per unit: each role's CPU-ms per unit (`ms`) split as its samples are. The worker's
    engine thread is `engine_ms` when given (its OS threads' CPU: torch's compute threads run native code that
    py-spy does not sample, so samples undercount it), and the rest of the worker is split by its other samples."""
    out: dict[str, dict[str, float]] = {}
    for role, split in splits.items():
        total = ms.get(role, 0.0)
        if role == "worker" and engine_ms is not None:
            rest = Split(Counter({k: v for k, v in split.samples.items() if k != ENGINE_THREAD}))
            out[role] = {ENGINE_THREAD: engine_ms,
                         **{stage: max(0.0, total - engine_ms) * f for stage, f in rest.share().items()}}
        else:
            out[role] = {stage: total * f for stage, f in split.share().items()}
    return out


def describe(stage_ms: dict[str, float], floor: float = 0.05) -> str:
    return ", ".join(f"{stage} {v:.2f}" for stage, v in stage_ms.items() if v >= floor)


def profile(app: str, units: int, go: Callable[[], object], keep: Path | None = None
            ) -> tuple[dict[str, dict[str, float]], str | None]:
    """go() (one untimed repetition against `app`) under py-spy: (role -> stage -> CPU-ms per unit, None or why
    there is no split). `units`: the requests (or tokens) go() serves; `keep`: as `profiled`'s."""
    before = serving_cpu.snapshot(app)
    _, splits, why = profiled(serving_cpu.pids(app, ROLES), 900, go, keep=keep)
    delta = serving_cpu.snapshot(app).minus(before)
    ms = serving_cpu.per_request_ms(delta, units, ROLES)
    engine_ms = 1e3 * delta.worker_threads.get(ENGINE_THREAD_OS_NAME, 0.0) / units
    return per_stage_ms(splits, ms, engine_ms), why


def rows(name: str, what: str, split: dict[str, dict[str, float]], why: str | None) -> list[Row]:
    """One report row per serving process: its CPU-ms per unit by stage, largest first."""
    if not split:
        return [Row(name, f"CPU-ms by stage: not measured ({why})", "", None)]
    return [Row(name, f"CPU-ms by stage, {role}, {what}: " + describe(split[role]), "ms", sum(split[role].values()))
            for role in ROLES if role in split]
