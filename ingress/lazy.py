"""A part of an ingress replica built once, off the event loop, from the first ModelInfo the workers give: the
tokenizer (ingress/text.py) and the image processor (ingress/images.py) each load from the model folder in seconds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from protocol import ModelInfo

T = TypeVar("T")


class Lazy(Generic[T]):
    def __init__(self, make: Callable[[ModelInfo], T]) -> None:
        self._make = make
        self.value: T | None = None
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> bool:
        return self.value is not None

    async def get(self, info: ModelInfo) -> T:
        if self.value is None:
            async with self._lock:
                if self.value is None:
                    self.value = await asyncio.to_thread(self._make, info)
        return self.value
