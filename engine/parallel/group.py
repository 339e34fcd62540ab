"""The process group a split worker's ranks share: torch.distributed with NCCL on CUDA and gloo on CPU, plus a gloo
group for the step messages (pickled objects travel on CPU, whatever the device: SGLang's rule).

With pipeline parallelism the world of `tensor_parallel_size x pipeline_parallel_size` ranks is cut into stages of
consecutive world ranks (world rank = stage x TP + rank in the stage, vLLM's layout): each stage's ranks share one
tensor-parallel group for their all-reduces, and activations go stage to stage by point-to-point send/recv between
the ranks of the same index (engine/parallel/pipeline.py). Rank 0's step messages then reach stage 0's ranks only
(one broadcast on their gloo group); each later stage gets them from the previous stage, beside the activations,
as non-blocking point-to-point sends on a gloo `link` group over the world, so no collective spans two stages and
each stage works on whichever step reaches it (several steps in flight).

Two timeouts: the collectives of a step wait at most `timeout_s` for the slowest rank (a layer's work apart); the
message group waits without a practical limit, since the other ranks wait there for rank 0's next step however
long the worker stays idle. A rank that dies breaks the ranks' TCP connections, which raises at once either way.

Collectives go through this class so that tests and the bench can count the bytes each one moved."""

from __future__ import annotations

import pickle
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# How long the other ranks wait for rank 0's next message: an idle worker is not a failure.
IDLE_TIMEOUT = timedelta(days=365)


@dataclass
class Traffic:
    """Payload bytes this rank sent into collectives, by kind (a ring all-reduce moves ~2x this on the wire)."""

    all_reduce: int = 0
    all_gather: int = 0
    broadcast: int = 0
    send: int = 0  # activations to the next stage (pipeline parallelism)
    calls: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int) -> None:
        setattr(self, kind, getattr(self, kind) + nbytes)
        self.calls[kind] = self.calls.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return self.all_reduce + self.all_gather + self.broadcast + self.send


@dataclass
class Sent:
    """Non-blocking sends in progress, with the tensors they read (kept alive until the sends are done)."""

    works: list[Any]
    tensors: list[torch.Tensor]

    def done(self) -> bool:
        """Whether every send finished (one that failed raises here: a peer died)."""
        if not all(w.is_completed() for w in self.works):
            return False
        self.wait()
        return True

    def wait(self) -> None:
        for w in self.works:
            w.wait()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class TPGroup:
    """This process's place in a split worker: rank `rank` of its stage's tensor-parallel group of `size` ranks, in
    stage `stage` of `stages` (world rank 0 drives: stage 0, rank 0)."""

    def __init__(self, world_rank: int, world_size: int, device: torch.device, address: str,
                 timeout_s: float = 120.0, stages: int = 1) -> None:
        """address: "host:port" of world rank 0's rendezvous store (every rank gets the same). Blocks until all
        `world_size` ranks have joined. stages: pipeline_parallel_size (it divides world_size)."""
        if world_size % stages:
            raise ValueError(f"{world_size} ranks do not cut into pipeline_parallel_size {stages} stages")
        self.world_rank, self.world_size, self.device = world_rank, world_size, device
        self.stages = stages
        self.size = world_size // stages
        self.stage, self.rank = divmod(world_rank, self.size)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # World rank 0's store listens on the address's host alone: torch's own TCPStore server (what a tcp://
        # init_method starts) binds every interface, so a group on loopback would be reachable from the network.
        self._listener: socket.socket | None = None
        host, port = address.rsplit(":", 1)
        store_timeout = timedelta(seconds=timeout_s)
        if world_rank == 0:
            self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host.strip("[]"), int(port)))
            self._listener.listen(max(128, world_size))
            store = dist.TCPStore(host, int(port), world_size, True, store_timeout,
                                  master_listen_fd=self._listener.fileno())
        else:
            store = dist.TCPStore(host, int(port), world_size, False, store_timeout)
        dist.init_process_group(backend, store=store, rank=world_rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        self.group: Any = dist.group.WORLD
        if stages > 1:  # every rank creates every stage's group, in the same order (torch.distributed's rule)
            groups = [dist.new_group(list(range(s * self.size, (s + 1) * self.size)), backend=backend)
                      for s in range(stages)]
            self.group = groups[self.stage]
        # Rank 0's step messages: stage 0's ranks (the world's with one stage); later stages get theirs by link.
        self.cpu_group: Any = dist.new_group(list(range(self.size)), backend="gloo", timeout=IDLE_TIMEOUT)
        self.link: Any = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT) if stages > 1 else None
        self.traffic = Traffic()

    def world_of(self, stage: int, rank: int) -> int:
        """The world rank of `rank` in `stage`."""
        return stage * self.size + rank

    @property
    def is_driver(self) -> bool:
        return self.world_rank == 0

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place; every rank gets the same bits (the ring reduces each chunk once, then passes it on)."""
        self.traffic.add("all_reduce", x.numel() * x.element_size())
        dist.all_reduce(x, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's x (same shape on every rank), in rank order."""
        self.traffic.add("all_gather", x.numel() * x.element_size())
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return parts

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """The stage's rank 0's x into every rank's x of the stage (same shape and dtype everywhere), in place."""
        if self.rank == 0:
            self.traffic.add("broadcast", x.numel() * x.element_size())
        dist.broadcast(x, src=self.world_of(self.stage, 0), group=self.group)
        return x

    def send(self, x: torch.Tensor, to: int) -> None:
        """x to world rank `to` (which calls recv with x's shape and dtype)."""
        self.traffic.add("send", x.numel() * x.element_size())
        dist.send(x.contiguous(), dst=to)

    def isend(self, x: torch.Tensor, to: int) -> Sent:
        """x to world rank `to` without waiting for it to be taken: the returned handle keeps x alive until done."""
        x = x.contiguous()
        self.traffic.add("send", x.numel() * x.element_size())
        return Sent([dist.isend(x, dst=to)], [x])

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        x = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(x, src=src)
        return x

    def isend_object(self, obj: Any, to: int) -> Sent:
        """A step message to world rank `to` on the link group (pickled: its length, then its bytes), not waiting."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.long)
        return Sent([dist.isend(size, dst=to, group=self.link), dist.isend(data, dst=to, group=self.link)],
                    [size, data])

    def recv_object(self, src: int) -> Any:
        """The next step message world rank `src` sent this rank on the link group (waits however long: idle)."""
        size = torch.empty(1, dtype=torch.long)
        dist.recv(size, src=src, group=self.link)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(data, src=src, group=self.link)
        return pickle.loads(data.numpy().tobytes())

    def broadcast_object(self, obj: Any = None) -> Any:
        """World rank 0's obj to every rank of stage 0 (of the world with one stage), pickled over the gloo group;
        other ranks pass None."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
