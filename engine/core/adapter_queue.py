"""Which waiting requests may take a LoRA adapter's slot now: the scheduler asks, in queue order, before it admits
each one; engine/runner/lora.py holds the slots (max_loras of them, least recently used evicted when idle).

A request whose adapter is not resident while every slot is held by admitted requests is not refused: it stays
queued, keeping its place, and the scheduler goes on to the requests behind it (vLLM's scheduler skips it the same
way). Skipping alone could starve it: newer requests of other missing adapters would take each slot that frees,
and a steady stream of one resident adapter's requests would keep that adapter pinned forever. So behind the
oldest such request (B), in the same step, a request is admitted only when it cannot delay B:
- a base-model request: always (it holds no slot);
- a request of a resident adapter: yes, except for the adapter held by the fewest requests (least recently used
  among equals), which is drained for B: no newer request pins it, its admitted requests end (each is bounded by
  its max_tokens, deadline or abort), and B loads into its slot once it is idle. Should another adapter come to
  have fewer requests, that one is drained instead: the smallest count never rises, so a slot does free;
- a request of another missing adapter: it waits behind B (the slot that frees goes to the older request first).
B waits for the admitted requests of one adapter, not for the queue behind it; requests for missing adapters start
in their order. A waiting request holds no slot, so abort, deadline and disconnect end it as any queued request.
"""

from __future__ import annotations

from typing import Protocol

from engine.core.sequence import Sequence


class AdapterSlots(Protocol):
    """The adapters' slots as the scheduler sees them (engine/runner/lora.py's LoraManager)."""

    def acquire(self, name: str) -> tuple[int, int] | None:
        """(slot, cache salt) held by one more request, the adapter loaded if need be; None: every slot is held."""
        ...

    def is_resident(self, name: str) -> bool: ...

    def fewest_pinned(self) -> str | None:
        """The resident adapter held by the fewest requests, least recently used among equals."""
        ...


class AdapterQueue:
    def __init__(self, slots: AdapterSlots) -> None:
        self.slots = slots
        self._blocked = False  # this step, an older request waits for a slot (B in the module docstring)
        self._draining: str | None = None  # the adapter whose slot B waits for

    def start_step(self) -> None:
        self._blocked = False
        self._draining = None

    def admits(self, seq: Sequence) -> bool:
        """Whether `seq`, next in queue order, may start now; if so it holds its adapter's slot until it finishes
        (seq.lora_slot, and seq.cache_salt, which keys its prefix-cache blocks by this load of the adapter).
        Raises ValueError (LoraError) when the adapter cannot be loaded."""
        name = seq.params.adapter and seq.params.adapter.name
        if name is None or seq.lora_slot is not None:
            return True  # the base model, or a preempted request that kept its slot
        if self._blocked and (name == self._draining or not self.slots.is_resident(name)):
            return False
        got = self.slots.acquire(name)
        if got is None:
            self._blocked = True
            self._draining = self.slots.fewest_pinned()
            return False
        seq.lora_slot, seq.cache_salt = got
        return True
