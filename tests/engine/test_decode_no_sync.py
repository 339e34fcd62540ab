"""A decode step (engine/runner/step_plan.py's layout, then the decode graphs of engine/runner/decode_graphs.py)
makes no host sync. The planner's prepare and the graph's forward (static buffers filled from the step, every layer,
the kernel) run under a dispatch spy that fails the test on `.item()`, `.tolist()`, `nonzero`, any device-to-host
copy and any host-to-device copy out of pageable memory. This machine has no GPU, so the spy keeps the device's books
itself: every tensor that existed before the step (weights, caches, static buffers, the device block table) is device
memory, and host memory is what the step builds from Python data, what is computed from that alone, and the step's
staging buffer (engine/runner/block_table.py, allocated pinned on CUDA: checked without CUDA). A step crosses in one
copy out of the staging buffer, and of the block tables only the pages that changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from engine.core.scheduler import SchedulerOutput
from engine.llm_engine import LLMEngine
from engine.runner.decode_graphs import DecodeGraphs
from engine.runner.step_plan import StepPlan
from tests.helpers.engine import make_engine, rand_ids, scoring

SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "is_nonzero", "equal", "_assert_async"}
FRESH_OPS = {"lift_fresh", "lift_fresh_copy", "scalar_tensor"}  # a tensor from Python data: host memory


def _sid(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class SyncSpy(TorchDispatchMode):
    """Records every host sync the dispatched ops imply, by the device books described above."""

    def __init__(self, pinned: Callable[[], torch.Tensor | None]) -> None:
        """pinned: the staging buffer of the step (read at each op: the planner allocates one per step)."""
        super().__init__()
        self.pinned = pinned
        self.host: dict[int, torch.Tensor] = {}  # held, so no device tensor reuses the address
        self.syncs: list[str] = []
        self.h2d: list[int] = []  # bytes copied from the staging buffer to the device
        self.paused = False  # inside the kernel (see _engine_with_graphs)
        self.graph_runs = 0

    def is_pinned(self, t: torch.Tensor) -> bool:
        staging = self.pinned()
        return staging is not None and _sid(t) == _sid(staging)

    def is_host(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and (_sid(t) in self.host or self.is_pinned(t))

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
                if self.is_pinned(src):
                    self.h2d.append(src.numel() * src.element_size())
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


def _engine_with_graphs(tiny_models) -> tuple[LLMEngine, DecodeGraphs, list[list[int]], SyncSpy]:
    """An engine whose decode steps run through the (eager, uncaptured) graphs, each step's layout (the planner's
    prepare) and graph forward under the spy; returns the engine, its graphs, the bytes of each step's copies out of
    the staging buffer and the spy."""
    eng = make_engine(tiny_models["llama"], attention_backend="varlen", max_num_seqs=8)
    graphs = eng.runner.decode_graphs(eng.kv.pool.num_blocks, eng.max_model_len, capture=False)
    assert isinstance(graphs, DecodeGraphs)
    eng.runner.graphs = graphs
    planner = eng.runner.planner
    spy = SyncSpy(lambda: planner.tables.staging)
    steps: list[list[int]] = []
    kernel = eng.runner.backend.kernel
    run, prepare = graphs.run, planner.prepare

    def opaque_kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        # The kernel is one launch on a GPU (flash or Triton; tests/engine/test_varlen_cuda_fake.py checks the
        # flash call on fake CUDA tensors); on CPU it is the reference, whose per-request loop reads lengths on
        # the host, so it runs outside the spy.
        spy.paused = True
        try:
            return kernel(*args, **kwargs)
        finally:
            spy.paused = False

    def spied_prepare(sched: SchedulerOutput) -> StepPlan:
        spy.h2d = []
        with spy, HostReadSpy(spy):
            plan = prepare(sched)
        steps.append(spy.h2d)
        return plan

    def spied(ids: torch.Tensor, pos: torch.Tensor, meta) -> torch.Tensor:  # noqa: ANN001
        with spy, HostReadSpy(spy):
            out = run(ids, pos, meta)
        steps[-1] = steps[-1] + spy.h2d[len(steps[-1]):]
        spy.graph_runs += 1
        return out

    eng.runner.backend.kernel = opaque_kernel
    planner.prepare = spied_prepare  # type: ignore[method-assign]
    graphs.run = spied  # type: ignore[method-assign]
    return eng, graphs, steps, spy


def test_decode_steps_make_no_host_sync(tiny_models) -> None:
    eng, graphs, steps, spy = _engine_with_graphs(tiny_models)
    from tests.helpers.engine import greedy

    prompts = [rand_ids(n, seed=n) for n in (3, 11, 26)]
    # block_size 4: 12 decode steps cross pages, and the requests finish together.
    outs = eng.generate(prompts, greedy(12), check=True)
    assert all(len(o.new_token_ids) == 12 for o in outs)
    assert spy.graph_runs == 11  # every step after the prompts' was a decode through the graphs
    assert spy.syncs == []
    # One copy a step, out of the staging buffer (int64). The prompts' step: ids, positions and token rows of 40
    # tokens, 3 chunk rows, 4 cu_seqlens, 3 key counts, a (row, first column, count) run per request and the
    # 1 + 3 + 7 pages.
    assert all(len(s) == 1 for s in steps)
    assert steps[0] == [8 * (3 * 40 + 3 + 4 + 3 + 3 * 3 + 11)]
    # A decode step: 3 x 3 + 3 + 4 + 3 integers, and only the pages taken since (one per request every 4 tokens,
    # each its own run: 4 integers), never a whole table: nothing here grows with the context.
    decode = [s[0] // 8 - 19 for s in steps[1:]]
    assert all(n % 4 == 0 and 0 <= n // 4 <= 3 for n in decode)
    assert sum(1 for n in decode if n == 0) >= 4
    # The decodes compute 11 tokens each: 14, 22 and 37 positions hold 4 + 6 + 10 pages, 9 more than the prompts'.
    assert len(decode) == 11 and sum(n // 4 for n in decode) == 9


def test_the_spy_catches_host_syncs(tiny_models) -> None:
    """The spy is no formality: a step that reads a value on the host or copies pageable memory is caught, and so
    is the per-request layout the planner once made (a block table from Python data, mixed with device tensors)."""
    eng, graphs, steps, spy = _engine_with_graphs(tiny_models)
    with spy, HostReadSpy(spy):
        graphs.positions.tolist()
        graphs.block_table[:1].copy_(torch.tensor([[1] * graphs.max_blocks], dtype=torch.int32))
        graphs.input_ids[:1].clone().copy_(graphs.block_table[0, :1])  # device to device: fine
        torch.nonzero(graphs.seqused_k)
        table = torch.tensor([3, 4], dtype=torch.long)
        (table[:, None] * 4 + graphs.positions[None, :4]).flatten()
    assert spy.syncs[0] == "tolist" and spy.syncs[1].startswith("pageable host-to-device copy")
    assert spy.syncs[2] == "nonzero" and spy.syncs[3].endswith("reads host memory on the device")
    assert len(spy.syncs) == 4
    # And the scoring path, unspied, is unchanged by it.
    assert eng.generate([rand_ids(9, seed=1)], scoring(0))[0].input_token_logprobs


def test_staging_buffer_is_pinned_on_cuda() -> None:
    """The device table on fake CUDA tensors (no GPU here) asks its staging buffer pinned, and the upload allocates
    it with that flag."""
    from engine.runner.block_table import DeviceBlockTables

    with FakeTensorMode():
        cuda = DeviceBlockTables(torch.device("cuda"), 8)
    assert cuda.table.is_cuda and cuda.pin

    asked: list[object] = []

    class TensorSpy(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.tensor:
                asked.append(kwargs.get("pin_memory"))
            return func(*args, **kwargs)

    host = DeviceBlockTables(torch.device("cpu"), 8)
    host.pin = True  # as on CUDA; torch.tensor is told, and (no CUDA here) the spy answers for it
    with TensorSpy():
        try:
            host.upload([[1, 2]])
        except RuntimeError:  # pinning needs a CUDA runtime
            pass
    assert asked == [True]
