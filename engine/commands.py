"""What the caller's threads hand AsyncEngine's engine thread: one small dataclass per command, matched by type.

Only the engine thread touches the LLMEngine, so the scheduler needs no locks; everything else puts one of these
on the command queue and wakes the thread."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from engine.multimodal.image_input import ImageInput
from protocol.control import GenerationControl
from protocol.sampling import SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class AddRequest:
    """Start a request (admitted already; its stream is registered)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # The request's images, in prompt order (a vision-language model; None: text only).
    images: list[ImageInput] | None = None


@dataclass(frozen=True)
class AbortRequest:
    """Abort a request whose stream is gone: its KV blocks are freed, nothing is delivered."""

    request_id: str


@dataclass(frozen=True)
class RunExclusive:
    """Run fn(engine) once no request is in the engine (abort_all: abort them first instead of letting them
    finish); adds that arrive meanwhile are held and start after it. `done` gets (fn's result, requests paused)."""

    fn: Callable[[LLMEngine], Any]
    abort_all: bool
    done: concurrent.futures.Future


@dataclass(frozen=True)
class RunBetweenSteps:
    """Run fn(engine) between two steps (a cache flush); `done` gets its result."""

    fn: Callable[[LLMEngine], Any]
    done: concurrent.futures.Future


@dataclass(frozen=True)
class Control:
    """A control operation (protocol/control.py: pause, resume, abort, flush) between two steps; `done` gets how
    many requests it touched."""

    op: GenerationControl
    done: concurrent.futures.Future


Command: TypeAlias = AddRequest | AbortRequest | RunExclusive | RunBetweenSteps | Control
