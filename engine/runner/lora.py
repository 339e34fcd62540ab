"""The LoRA adapters of one engine: registered by name (config or run time), up to max_loras resident in slots of
every targeted Linear (least recently used evicted when no running request holds it, reloaded on demand), each
request pinning its adapter's slot from its admission to its end. A request whose adapter cannot have a slot yet
waits in the scheduler's queue (engine/core/adapter_queue.py). The model runner sets the step's rows by slot
(LoraStep).

With tensor_parallel_size > 1 rank 0's manager decides (names, slots, pins) and tells the other ranks each load and
eviction by slot (engine/parallel/messages.py's Adapter), in order with the steps; every rank writes its share of
the adapter into the same slot (AdapterSlots: each split Linear keeps its share, engine/layers/lora.py), and each
step's rows by slot travel with its Forward message."""

from __future__ import annotations

import itertools
import os
from collections import Counter, OrderedDict

import torch

from engine.config import EngineConfig
from engine.layers.lora import LoraSlots, LoraStep
from engine.loading.lora import LoraAdapter, LoraError, read_adapter
from engine.models.llama import LlamaForCausalLM
from engine.parallel.driver import TensorParallel


class AdapterSlots:
    """The slots of every Linear an adapter may target, in one model (a rank's shard with tensor parallelism): an
    adapter written into a slot, a slot cleared. Allocated on the first write (no adapter: nothing allocated)."""

    def __init__(self, model: LlamaForCausalLM, num_slots: int, max_rank: int, device: torch.device) -> None:
        self.model, self.num_slots, self.max_rank, self.device = model, num_slots, max_rank, device
        self.step = LoraStep()
        self._ready = False

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        self._ensure()
        for (layer, module), (a, b) in adapter.weights.items():
            linear, part, _ = self.model.lora_targets(layer)[module]
            assert linear.lora is not None
            linear.lora.set(slot, part, a.to(self.device), b.to(self.device), adapter.scaling)

    def clear(self, slot: int) -> None:
        for i in range(self.model.num_layers):
            for linear, _, _ in self.model.lora_targets(i).values():
                if linear.lora is not None:
                    linear.lora.clear(slot)

    def _ensure(self) -> None:
        if self._ready:
            return
        for i in range(self.model.num_layers):
            for linear, _, parts in self.model.lora_targets(i).values():
                if linear.lora is None:
                    linear.lora = LoraSlots(self.step, linear.in_features, parts, self.num_slots, self.max_rank,
                                            self.model.dtype, self.device, linear.shard)
        self._ready = True


class LoraManager:
    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, device: torch.device,
                 parallel: TensorParallel | None = None) -> None:
        """parallel: rank 0's handle on the other ranks (model is then rank 0's shard): each load and eviction is
        sent to them."""
        self.model = model
        self.parallel = parallel
        self.max_loras = config.max_loras
        self.max_rank = config.max_lora_rank
        self.stages = config.pipeline_parallel_size
        self.slots = AdapterSlots(model, self.max_loras, self.max_rank, device)
        self.step = self.slots.step
        self.paths: dict[str, str] = {}
        # What each adapter's folder held when it was last read (folder_stamp): a request that finds it changed and
        # the adapter idle has it read again (retrained in place, then unloaded and loaded under the same name).
        self.stamps: dict[str, tuple] = {}
        self.resident: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name -> (slot, cache salt); LRU first
        self.pins: Counter[str] = Counter()  # requests holding the adapter's slot (admitted, not finished)
        self.users: Counter[str] = Counter()  # live requests of the adapter, queued or admitted
        self.free = list(range(self.max_loras - 1, -1, -1))
        self._loads = itertools.count(1)
        for name, path in (config.lora_adapters or {}).items():
            self.register(name, path)

    def names(self) -> list[str]:
        return list(self.paths)

    def register(self, name: str, path: str) -> None:
        """Serve the adapter at `path` as `name`: read and checked now (LoraError), made resident when a slot is
        free."""
        self._refuse_stages()
        if name in self.paths:
            raise LoraError(f"The adapter {name!r} is already loaded (POST /v1/unload_lora_adapter first).")
        stamp = folder_stamp(path)  # before the read: a write during it shows as a change next time
        self._check(read_adapter(name, path, self.max_rank, self.model.dtype))
        self.paths[name] = path
        self.stamps[name] = stamp
        if self.free:
            self._load(name)

    def ensure(self, name: str, path: str) -> None:
        """Serve `name` from `path` (a request that carries its adapter's folder): registered when new, replaced
        when the name now means another folder, or the folder's files changed since they were read (and no live
        request uses the old one)."""
        if self.paths.get(name) == path:
            if self.users[name] or self.stamps.get(name) == folder_stamp(path):
                return  # live requests of the adapter keep the weights they started with
        if name in self.paths:
            self.unregister(name)
        self.register(name, path)

    def check(self, name: str, path: str) -> None:
        """Read and check an adapter against the model without loading it (LoraError when refused)."""
        self._refuse_stages()
        self._check(read_adapter(name, path, self.max_rank, self.model.dtype))

    def _refuse_stages(self) -> None:
        if self.stages > 1:  # each stage holds its own layers; adapters are not cut by stage yet
            raise LoraError(f"LoRA adapters are not served with pipeline_parallel_size {self.stages} yet.")

    def unregister(self, name: str) -> None:
        if name not in self.paths:
            raise LoraError(f"The adapter {name!r} is not loaded; loaded: {self.names()}.")
        if self.users[name]:
            raise LoraError(f"The adapter {name!r} is in use by {self.users[name]} request(s), running or queued.")
        self._evict(name)
        del self.paths[name]
        self.stamps.pop(name, None)

    def join(self, name: str, path: str | None) -> None:
        """A request of `name` arrives (`path`: the adapter's folder, when the request carries it): the adapter is
        known from now until the request's `leave`, and has its slot once the scheduler admits it (`acquire`)."""
        if path is not None:
            self.ensure(name, path)
        if name not in self.paths:
            raise LoraError(f"The adapter {name!r} is not loaded: this server has {self.names()} (POST "
                            "/v1/load_lora_adapter loads one).")
        self.users[name] += 1

    def acquire(self, name: str) -> tuple[int, int] | None:
        """(slot, cache salt) of `name` for a request the scheduler admits, loaded first if not resident (an idle
        adapter evicted, least recently used first); None while every slot is held by admitted requests."""
        if name not in self.resident:
            if not self.free:
                victim = next((n for n in self.resident if not self.pins[n]), None)
                if victim is None:
                    return None
                self._evict(victim)
            try:
                self._load(name)
            except LoraError as exc:  # its folder changed since it was checked
                raise LoraError(f"The adapter {name!r} could not be loaded: {exc}") from exc
        self.resident.move_to_end(name)
        self.pins[name] += 1
        return self.resident[name]

    def is_resident(self, name: str) -> bool:
        return name in self.resident

    def fewest_pinned(self) -> str | None:
        """The resident adapter held by the fewest requests (least recently used among equals): the one whose slot
        frees soonest if no new request takes it."""
        return min(self.resident, key=lambda n: self.pins[n], default=None)

    def leave(self, name: str, pinned: bool) -> None:
        """A request of `name` ends (`pinned`: it had been admitted and held the slot)."""
        self.users[name] -= 1
        if pinned:
            self.pins[name] -= 1

    def set_step(self, segments: list[tuple[int, int, int]]) -> None:
        """(slot, first row, end row) runs of the step's flat batch (ModelRunner.prepare)."""
        self.step.set(segments, self.model.dtype, self.slots.device)

    # --- slots ----------------------------------------------------------------------------------
    def _load(self, name: str) -> None:
        self.stamps[name] = folder_stamp(self.paths[name])
        adapter = read_adapter(name, self.paths[name], self.max_rank, self.model.dtype)
        self._check(adapter)
        slot = self.free.pop()
        if self.parallel is not None:
            self.parallel.load_adapter(slot, name, self.paths[name])
        self.slots.write(slot, adapter)
        # A new salt per load: blocks computed with an earlier load of the same name are never hit again.
        self.resident[name] = (slot, hash(("lora", name, next(self._loads))))

    def _evict(self, name: str) -> None:
        slot_salt = self.resident.pop(name, None)
        if slot_salt is None:
            return
        slot = slot_salt[0]
        if self.parallel is not None:
            self.parallel.clear_adapter(slot)
        self.slots.clear(slot)
        self.free.append(slot)

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
            width = linear.whole_in_features
            if tuple(a.shape) != (adapter.rank, width) or tuple(b.shape) != (parts[part], adapter.rank):
                raise LoraError(f"The adapter {adapter.name!r} does not fit this model: {module} of layer {layer} "
                                f"has A {tuple(a.shape)} and B {tuple(b.shape)}, expected "
                                f"({adapter.rank}, {width}) and ({parts[part]}, {adapter.rank}).")


def folder_stamp(path: str) -> tuple:
    """(name, size, mtime_ns, ctime_ns, inode) of each file in an adapter's folder: changes when a file is
    rewritten (a few stat calls: cheap enough for every request that names the adapter). () when the folder cannot
    be read."""
    try:
        with os.scandir(path) as entries:
            return tuple(sorted((e.name, (st := e.stat()).st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                                for e in entries if e.is_file()))
    except OSError:
        return ()
