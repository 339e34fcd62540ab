"""fla-core's gated delta rule kernels, as engine/layers/gated_delta_cuda.py runs them on CUDA for Qwen3.5's linear
layers (chunk_gated_delta_rule for prefill chunks, fused_recurrent_gated_delta_rule for decodes), against the torch
reference (engine/layers/gated_delta.py). On CPU they run in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 without a GPU); fla-core and triton are dependencies, so these fail, never skip, for want of them.
Grouped value heads throughout (4 value heads over 2 key heads: fla's own GVA against the reference's repeat), float32
and float16 inputs (g and the state float32, as the layer passes them). Which branch each case covers:
- prefill: one 70-token chunk (B=1: a full 64-token block and a partial one), from zeros and from a carried state
- carry: the same 70 tokens as two chunks (40 + 30), the first's final state the second's initial one
- decode: three requests of one token each (B=3), each from its own state
- varlen: fla's packed form of both kernels (one row of three sequences, cu_seqlens, an initial state each: 5, 70
  and 13 tokens for the chunked kernel, 2, 7 and 3 for the recurrent one), the form a step's chunks take when they
  run as one call

The interpreter's gap: compiled Triton makes a `for i in range(n)` loop's variable an int32 tensor; the
interpreter leaves it a Python int (it rewrites assignments into tensors, not loop targets), so fla's
`i_t.to(tl.int64)` (module fla.ops.common.chunk_delta_h, the chunked path's state pass) fails there with
"'int' object has no attribute 'to'". In the interpreter the test gives the rewriter one more rule, the
compiler's: the variable of a `range` / `tl.range` loop is a tensor in the loop body (`tl.static_range`'s stays a
Python int, a constexpr as compiled).

Autotune: most of fla's chunked kernels are under triton.autotune (fla's CachedAutotuner), which times every config
on the device before the first launch. The interpreter has no device to time on: Triton's benchmarker is the
active GPU driver's, and unpinned the first chunked call fails with "RuntimeError: 0 active drivers ([]). There
should only be one." (and timing each config through the interpreter would multiply its cost). So in the
interpreter (only) each of fla's autotuners is pinned to the first config of its own list: a config fla ships for
the kernel, launched as a one-config autotune launches it. On a GPU the autotuners run as shipped."""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator

import pytest
import torch

from engine.layers.gated_delta import chunk_gated_delta_rule, recurrent_gated_delta_rule
from engine.layers.gated_delta_cuda import fla_rules
from tests.helpers.triton_device import kernel_device

# DK: Qwen3.5's key width (fla's state pass splits K into blocks of 64: two of them); heads grouped as the engine's.
HK, HV, DK, DV = 2, 4, 128, 32
# float32: the interpreter's dots are IEEE float32 (no TF32, unlike a GPU's), so only summation order differs from
# the reference: measured <= 4e-7. float16: q, k, v and beta arrive rounded (the reference gets the same rounded
# values in float32), and fla's kernels round within (the blocks' dot operands, k, v and the state's products, go to
# float16, 2^-11 relative, before float32 accumulation): measured <= 6e-5 on the outputs, 4.3e-4 on the final state
# (entries of magnitude ~1). The bounds leave room for the GPU's other summation orders.
TOL = {torch.float32: 2e-6, torch.float16: 2e-3}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])


class _LoopVarsAreTensors(ast.NodeTransformer):
    """The interpreter's rewrite (assignments become tensors) plus loop variables of range / tl.range loops."""

    def __init__(self, base: ast.NodeTransformer) -> None:
        self.base = base

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        return self.base.visit_Assign(node)

    def visit_For(self, node: ast.For) -> ast.AST:
        self.generic_visit(node)
        call = node.iter
        name = call.func.attr if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) else \
            call.func.id if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else None
        if name == "range" and isinstance(node.target, ast.Name):
            var = node.target.id
            to_tensor = ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                      ctx=ast.Load())
            node.body.insert(0, ast.Assign(targets=[ast.Name(id=var, ctx=ast.Store())], value=ast.Call(
                func=to_tensor, args=[ast.Name(id=var, ctx=ast.Load()), ast.Constant(value=False)], keywords=[])))
        return node


def _pin_autotuners(mp: pytest.MonkeyPatch) -> int:
    """Each of fla's autotuners (reached through triton.heuristics wrappers too) down to its first config."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import KernelInterface

    pinned = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla."):
            continue
        for obj in list(vars(module).values()):
            while isinstance(obj, KernelInterface):  # Heuristics -> Autotuner -> the jitted function
                if isinstance(obj, Autotuner) and len(obj.configs) > 1:
                    mp.setattr(obj, "configs", obj.configs[:1])
                    pinned += 1
                obj = getattr(obj, "fn", None)
    return pinned


@pytest.fixture(scope="module")
def rules() -> Iterator[tuple]:
    dev = kernel_device()
    found = fla_rules()
    assert found is not None, "fla-core does not import: pyproject pins it (and triton, in the dev extras)"
    with pytest.MonkeyPatch.context() as mp:
        if dev.type == "cpu":
            assert os.environ.get("TRITON_INTERPRET") == "1"
            assert _pin_autotuners(mp) > 0  # the chunked path's kernels are autotuned: something was pinned
            from triton.runtime.interpreter import FunctionRewriter

            mp.setattr(FunctionRewriter, "ast_transformer", _LoopVarsAreTensors(FunctionRewriter.ast_transformer))
        yield found


def _inputs(b: int, length: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k [b, L, HK, DK]; v [b, L, HV, DV]; g [b, L, HV] float32 (log decay as the layer computes it:
    -exp(A_log) * softplus(a + dt_bias), spread from slow to fast); beta [b, L, HV] in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, length, HK, DK, generator=gen).to(dtype)
    k = torch.randn(b, length, HK, DK, generator=gen).to(dtype)
    v = torch.randn(b, length, HV, DV, generator=gen).to(dtype)
    a_log = torch.linspace(-2.0, 1.0, HV)
    g = -a_log.exp() * torch.nn.functional.softplus(torch.randn(b, length, HV, generator=gen))
    beta = torch.rand(b, length, HV, generator=gen).sigmoid().to(dtype)
    return q, k, v, g, beta


def _state(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, HV, DK, DV, generator=torch.Generator().manual_seed(seed)) * 0.5


def _reference(rule, q, k, v, g, beta, state):
    """The torch reference on the same (rounded) inputs in float32."""
    return rule(q.float(), k.float(), v.float(), g, beta.float(), state)


def _on(dev: torch.device, *xs: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if x is None else x.to(dev) for x in xs]


def _err(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    return ((got[0].float().cpu() - want[0]).abs().max().item(), (got[1].cpu() - want[1]).abs().max().item())


@DTYPES
@pytest.mark.parametrize("carried", [False, True], ids=["zeros", "carried"])
def test_prefill_chunk(rules: tuple, dtype: torch.dtype, carried: bool) -> None:
    dev = kernel_device()
    q, k, v, g, beta = _inputs(1, 70, dtype, seed=1)
    state = _state(1, 2) if carried else None
    out, final = rules[0](*_on(dev, q, k, v, g, beta, state))
    assert out.dtype == dtype and out.shape == (1, 70, HV, DV) and final.dtype == torch.float32
    err = _err((out, final), _reference(chunk_gated_delta_rule, q, k, v, g, beta, state))
    assert max(err) < TOL[dtype], err


def test_state_carried_across_chunks(rules: tuple) -> None:
    """float32 only: the carry is the state's path, float32 whatever the inputs' dtype (the prefill cases cover
    float16 from a given state)."""
    dev, dtype = kernel_device(), torch.float32
    q, k, v, g, beta = _inputs(1, 70, dtype, seed=3)
    state = _state(1, 4)
    first = rules[0](*_on(dev, *(x[:, :40] for x in (q, k, v, g, beta)), state))
    second = rules[0](*_on(dev, *(x[:, 40:] for x in (q, k, v, g, beta))), first[1])
    out = torch.cat([first[0].cpu(), second[0].cpu()], dim=1)
    err = _err((out, second[1]), _reference(chunk_gated_delta_rule, q, k, v, g, beta, state))
    assert max(err) < TOL[dtype], err


@DTYPES
def test_decodes(rules: tuple, dtype: torch.dtype) -> None:
    dev = kernel_device()
    q, k, v, g, beta = _inputs(3, 1, dtype, seed=5)
    state = _state(3, 6)
    out, final = rules[1](*_on(dev, q, k, v, g, beta, state))
    assert out.shape == (3, 1, HV, DV)
    err = _err((out, final), _reference(recurrent_gated_delta_rule, q, k, v, g, beta, state))
    assert max(err) < TOL[dtype], err


@DTYPES
@pytest.mark.parametrize("kernel", ["chunk", "recurrent"])
def test_varlen(rules: tuple, dtype: torch.dtype, kernel: str) -> None:
    """fla's packed form: sequences laid end to end in one row, cu_seqlens their bounds, one state each in and out;
    each sequence equals the reference run alone from its state."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent

    dev = kernel_device()
    lens = [5, 70, 13] if kernel == "chunk" else [2, 7, 3]
    q, k, v, g, beta = _inputs(1, sum(lens), dtype, seed=7)
    states = _state(len(lens), 8)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.long)
    fn = fla_chunk if kernel == "chunk" else fla_recurrent
    qd, kd, vd, gd, bd, sd, cud = _on(dev, q, k, v, g, beta, states, cu)
    out, final = fn(qd, kd, vd, g=gd, beta=bd, initial_state=sd, output_final_state=True,
                    use_qk_l2norm_in_kernel=True, cu_seqlens=cud)
    rule = chunk_gated_delta_rule if kernel == "chunk" else recurrent_gated_delta_rule
    for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        want = _reference(rule, *(x[:, lo:hi] for x in (q, k, v, g, beta)), states[i:i + 1])
        err = _err((out[:, lo:hi], final[i:i + 1]), want)
        assert max(err) < TOL[dtype], (i, err)
