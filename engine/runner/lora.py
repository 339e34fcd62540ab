"""The LoRA adapters of one engine: registered by name (config or run time), up to max_loras resident in slots of
every targeted Linear (least recently used evicted when no running request holds it, reloaded on demand), each
request pinning its adapter's slot while it runs. The model runner sets the step's rows by slot (LoraStep)."""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict

import torch

from engine.config import EngineConfig
from engine.layers.lora import LoraSlots, LoraStep
from engine.loading.lora import LoraAdapter, LoraError, read_adapter
from engine.models.llama import LlamaForCausalLM


class LoraManager:
    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.max_loras = config.max_loras
        self.max_rank = config.max_lora_rank
        self.step = LoraStep()
        self.paths: dict[str, str] = {}
        self.resident: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name -> (slot, cache salt); LRU first
        self.pins: Counter[str] = Counter()
        self.free = list(range(self.max_loras - 1, -1, -1))
        self._slots_ready = False
        self._loads = itertools.count(1)
        for name, path in (config.lora_adapters or {}).items():
            self.register(name, path)

    def names(self) -> list[str]:
        return list(self.paths)

    def register(self, name: str, path: str) -> None:
        """Serve the adapter at `path` as `name`: read and checked now (LoraError), made resident when a slot is
        free."""
        if name in self.paths:
            raise LoraError(f"The adapter {name!r} is already loaded (POST /v1/unload_lora_adapter first).")
        self._check(read_adapter(name, path, self.max_rank, self.model.dtype))
        self.paths[name] = path
        if self.free:
            self._load(name)

    def ensure(self, name: str, path: str) -> None:
        """Serve `name` from `path` (a request that carries its adapter's folder): registered when new, replaced
        when the name now means another folder (and no running request holds the old one)."""
        if self.paths.get(name) == path:
            return
        if name in self.paths:
            self.unregister(name)
        self.register(name, path)

    def check(self, name: str, path: str) -> None:
        """Read and check an adapter against the model without loading it (LoraError when refused)."""
        self._check(read_adapter(name, path, self.max_rank, self.model.dtype))

    def unregister(self, name: str) -> None:
        if name not in self.paths:
            raise LoraError(f"The adapter {name!r} is not loaded; loaded: {self.names()}.")
        if self.pins[name]:
            raise LoraError(f"The adapter {name!r} is in use by {self.pins[name]} running request(s).")
        self._evict(name)
        del self.paths[name]

    def acquire(self, name: str) -> tuple[int, int]:
        """(slot, cache salt) of `name` for a request that starts; loaded first if not resident."""
        if name not in self.paths:
            raise LoraError(f"The adapter {name!r} is not loaded: this server has {self.names()} (POST "
                            "/v1/load_lora_adapter loads one).")
        if name not in self.resident:
            if not self.free:
                victim = next((n for n in self.resident if not self.pins[n]), None)
                if victim is None:
                    raise LoraError(f"All {self.max_loras} adapter slots (config field max_loras) are held by "
                                    f"running requests; the adapter {name!r} cannot be loaded now.")
                self._evict(victim)
            self._load(name)
        self.resident.move_to_end(name)
        self.pins[name] += 1
        return self.resident[name]

    def release(self, name: str) -> None:
        self.pins[name] -= 1

    def set_step(self, segments: list[tuple[int, int, int]]) -> None:
        """(slot, first row, end row) runs of the step's flat batch (ModelRunner.prepare)."""
        self.step.set(segments, self.model.dtype, self.device)

    # --- slots ----------------------------------------------------------------------------------
    def _load(self, name: str) -> None:
        adapter = read_adapter(name, self.paths[name], self.max_rank, self.model.dtype)
        self._check(adapter)
        self._ensure_slots()
        slot = self.free.pop()
        for (layer, module), (a, b) in adapter.weights.items():
            linear, part, _ = self.model.lora_targets(layer)[module]
            assert linear.lora is not None
            linear.lora.set(slot, part, a.to(self.device), b.to(self.device), adapter.scaling)
        # A new salt per load: blocks computed with an earlier load of the same name are never hit again.
        self.resident[name] = (slot, hash(("lora", name, next(self._loads))))

    def _evict(self, name: str) -> None:
        slot_salt = self.resident.pop(name, None)
        if slot_salt is None:
            return
        slot = slot_salt[0]
        for i in range(self.model.num_layers):
            for linear, _, _ in self.model.lora_targets(i).values():
                if linear.lora is not None:
                    linear.lora.clear(slot)
        self.free.append(slot)

    def _ensure_slots(self) -> None:
        """Each target Linear gets its slots on the first load (a server with no adapter allocates nothing)."""
        if self._slots_ready:
            return
        for i in range(self.model.num_layers):
            for linear, _, parts in self.model.lora_targets(i).values():
                if linear.lora is None:
                    linear.lora = LoraSlots(self.step, linear.in_features, parts, self.max_loras, self.max_rank,
                                            self.model.dtype, self.device)
        self._slots_ready = True

    def _check(self, adapter: LoraAdapter) -> None:
        """Every weight of the adapter names a target of the served model, with its shapes."""
        for (layer, module), (a, b) in adapter.weights.items():
            if layer >= self.model.num_layers:
                raise LoraError(f"The adapter {adapter.name!r} adapts layer {layer}; the model has "
                                f"{self.model.num_layers}.")
            targets = self.model.lora_targets(layer)
            if module not in targets:
                raise LoraError(f"The adapter {adapter.name!r} adapts the module {module!r} of layer {layer}, which "
                                f"this model does not serve adapted (targets: {sorted(targets)}).")
            linear, part, parts = targets[module]
            if tuple(a.shape) != (adapter.rank, linear.in_features) or tuple(b.shape) != (parts[part], adapter.rank):
                raise LoraError(f"The adapter {adapter.name!r} does not fit this model: {module} of layer {layer} "
                                f"has A {tuple(a.shape)} and B {tuple(b.shape)}, expected "
                                f"({adapter.rank}, {linear.in_features}) and ({parts[part]}, {adapter.rank}).")
