"""A decode step through the decode graphs (engine/runner/decode_graphs.py) makes no host sync. The graph's
forward (static buffers filled from the step, every layer, the kernel) runs under a dispatch spy that fails the
test on `.item()`, `.tolist()`, `nonzero`, any device-to-host copy and any host-to-device copy out of pageable
memory. This machine has no GPU, so the spy keeps the device's books itself: every tensor that existed before the
step (weights, caches, static buffers, the step's inputs, which the planner leaves on the device) is device memory,
and host memory is what the step builds from Python data, what is computed from that alone, and the graphs' staging
buffer (`host_table`, whose allocation asks for pinned memory on CUDA: checked on fake CUDA tensors). The block
table's rows must come from the staging buffer, and only the rows that changed."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from engine.llm_engine import LLMEngine
from engine.runner.decode_graphs import DecodeGraphs
from tests.helpers.engine import make_engine, rand_ids, scoring

SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "is_nonzero", "equal", "_assert_async"}
FRESH_OPS = {"lift_fresh", "lift_fresh_copy", "scalar_tensor"}  # a tensor from Python data: host memory


def _sid(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class SyncSpy(TorchDispatchMode):
    """Records every host sync the dispatched ops imply, by the device books described above."""

    def __init__(self, pinned: torch.Tensor) -> None:
        super().__init__()
        self.pinned = _sid(pinned)
        self.host: dict[int, torch.Tensor] = {self.pinned: pinned}  # held, so no device tensor reuses the address
        self.syncs: list[str] = []
        self.h2d: list[tuple[int, ...]] = []  # shapes copied from the staging buffer to the device
        self.paused = False  # inside the kernel (see _engine_with_graphs)

    def is_host(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and _sid(t) in self.host

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        if name in SYNC_OPS:
            self.syncs.append(name)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        host_in = [t for t in tensors if self.is_host(t)]
        if name == "copy_":
            dst, src = args[0], args[1]
            if self.is_host(src) and not self.is_host(dst):
                if _sid(src) == self.pinned:
                    self.h2d.append(tuple(src.shape))
                else:
                    self.syncs.append(f"pageable host-to-device copy {tuple(src.shape)}")
            elif self.is_host(dst) and not self.is_host(src):
                self.syncs.append(f"device-to-host copy {tuple(src.shape)}")
        elif host_in and len(host_in) < len(tensors) and any(t.dim() > 0 for t in host_in):
            self.syncs.append(f"{name} reads host memory on the device")
        out = func(*args, **kwargs)
        if name in FRESH_OPS or (host_in and len(host_in) == len(tensors) and name != "copy_"):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.host.setdefault(_sid(t), t)
        return out


class HostReadSpy(TorchFunctionMode):
    """`.item()`, `.tolist()` and `.numpy()`: they read a tensor on the host."""

    def __init__(self, spy: SyncSpy) -> None:
        super().__init__()
        self.spy = spy

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if (getattr(func, "__name__", "") in ("item", "tolist", "numpy") and args and not self.spy.paused
                and not self.spy.is_host(args[0])):
            self.spy.syncs.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _engine_with_graphs(tiny_models) -> tuple[LLMEngine, DecodeGraphs, list[list[tuple[int, ...]]], SyncSpy]:
    """An engine whose decode steps run through the (eager, uncaptured) graphs, each step's graph forward under
    the spy; returns the engine, its graphs, the staged copies of each step and the spy."""
    eng = make_engine(tiny_models["llama"], attention_backend="varlen", max_num_seqs=8)
    graphs = eng.runner.decode_graphs(eng.kv.pool.num_blocks, eng.max_model_len, capture=False)
    assert isinstance(graphs, DecodeGraphs)
    eng.runner.graphs = graphs
    spy = SyncSpy(graphs.host_table)
    steps: list[list[tuple[int, ...]]] = []
    kernel = eng.runner.backend.kernel
    run = graphs.run

    def opaque_kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        # The kernel is one launch on a GPU (flash or Triton; tests/engine/test_varlen_cuda_fake.py checks the
        # flash call on fake CUDA tensors); on CPU it is the reference, whose per-request loop reads lengths on
        # the host, so it runs outside the spy.
        spy.paused = True
        try:
            return kernel(*args, **kwargs)
        finally:
            spy.paused = False

    def spied(ids: torch.Tensor, pos: torch.Tensor, meta) -> torch.Tensor:  # noqa: ANN001
        spy.h2d = []
        with spy, HostReadSpy(spy):
            out = run(ids, pos, meta)
        steps.append(spy.h2d)
        return out

    eng.runner.backend.kernel = opaque_kernel
    graphs.run = spied  # type: ignore[method-assign]
    return eng, graphs, steps, spy


def test_decode_steps_make_no_host_sync(tiny_models) -> None:
    eng, graphs, steps, spy = _engine_with_graphs(tiny_models)
    from tests.helpers.engine import greedy

    prompts = [rand_ids(n, seed=n) for n in (3, 11, 26)]
    # block_size 4: 12 decode steps cross pages, and the requests finish together.
    outs = eng.generate(prompts, greedy(12), check=True)
    assert all(len(o.new_token_ids) == 12 for o in outs)
    assert len(steps) == 11  # every step after the prompts' was a decode through the graphs
    assert spy.syncs == []
    # Only changed rows cross, as wide as their pages: the first step all 4 rows (3 requests, 1 padding row,
    # 7 pages the widest); then a row only when its request took a new page (every 4 tokens at block_size 4), one
    # copy spanning the changed rows, so most steps copy nothing and none copies the table's width.
    assert steps[0] == [(4, 7)]
    assert all(len(s) <= 1 and all(rows <= 2 for rows, _ in s) for s in steps[1:])
    assert sum(1 for s in steps if not s) >= 4
    assert all(width <= 10 < graphs.max_blocks for s in steps for _, width in s)


def test_the_spy_catches_host_syncs(tiny_models) -> None:
    """The spy is no formality: a step that reads a value on the host or copies pageable memory is caught."""
    eng, graphs, steps, spy = _engine_with_graphs(tiny_models)
    with spy, HostReadSpy(spy):
        graphs.positions.tolist()
        graphs.block_table[:1].copy_(torch.tensor([[1] * graphs.max_blocks], dtype=torch.int32))
        graphs.host_table[:1].copy_(graphs.block_table[:1])
        torch.nonzero(graphs.seqused_k)
    assert spy.syncs[0] == "tolist" and spy.syncs[1].startswith("pageable host-to-device copy")
    assert spy.syncs[2].startswith("device-to-host copy") and spy.syncs[3] == "nonzero"
    # And the scoring path, unspied, is unchanged by it.
    assert eng.generate([rand_ids(9, seed=1)], scoring(0))[0].input_token_logprobs


def test_staging_buffer_is_pinned_on_cuda() -> None:
    """On fake CUDA tensors (no GPU here): the graphs allocate their host staging buffer pinned."""
    from engine.layers.attention import VarlenPagedAttention
    from engine.layers.varlen import varlen_attention_cuda

    pinned: list[bool] = []

    class PinSpy(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.dim() == 2:
                pinned.append(bool(kwargs.get("pin_memory")))
            return out

    with FakeTensorMode(), PinSpy():
        graphs = DecodeGraphs(lambda *a: torch.empty(0), VarlenPagedAttention(16, varlen_attention_cuda), 64,
                              torch.bfloat16, torch.device("cuda"), 8, 32, scratch_block=10, capture=False)
    assert graphs.block_table.is_cuda and graphs.host_table.device.type == "cpu"
    assert pinned == [True]
