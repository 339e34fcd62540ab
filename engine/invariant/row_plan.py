"""How batch-invariant mode cuts one matmul's rows into calls whose bits it has checked on the running machine.

A BLAS library picks its kernel, its blocking and how it splits the work between threads from the call's shape
and the thread count, and documents none of it: MKL on a 2-core AVX-512 Xeon gives a row of SmolLM2's down
projection other bits in a call of 57-192 rows than in one of 16-56 or 193+ (2 threads; at 1 thread all agree),
where an AVX2 EPYC agreed from 16 rows up. What does hold from first principles is narrower:

1. IEEE-754 arithmetic is deterministic: the same operands combined in the same order give the same bits. A GEMM
   kernel is data-oblivious (its order follows the shape, never the values), and MKL promises the same results
   run to run for the same shape, thread count and aligned operands (its "conditional numerical
   reproducibility" notes). So every call of one shape computes a row in one fixed order.
2. Whether two shapes share that order can be seen on random data: a different association of the K products
   changes the last bits of most outputs, so a call of r rows whose every output equals the reference's, on
   random data, computes in the reference's order (one differing association among r x N outputs would show).

So at the mode's start, for each weight shape of the model, with its own weights, dtype, device and the thread
count it will run with, `calibrate` checks (a) that the reference call (QUANTUM rows) gives a row the same bits
at any place in the call and beside any other rows, and (b) which candidate row counts give every row the
reference's bits. A call of n rows then runs as calls of checked counts only (the last one zero-padded), chosen
by `RowPlan.pieces`. If (a) fails the mode refuses to start (InvariantModeError). Candidate counts are a short
geometric ladder, so the check costs about a hundred calls per shape instead of one per possible row count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

# Rows of the reference call: the smallest call of every plan, and the step between candidate counts. On CPU, 16
# rows reach MKL's large-call kernel (below it: another one, ~3e-5 apart); on CUDA, 64 rows.
QUANTUM = {"cpu": 16}
DEFAULT_QUANTUM = 64
# Candidate counts, in quanta. Geometric, so any call is covered by few pieces of checked counts.
LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# What one more call costs, in rows of compute (packing the weights again, thread start): measured on SmolLM2's
# shapes, 16-row calls run ~3x slower per row than one large call, i.e. ~32 rows of overhead each.
CALL_OVERHEAD_ROWS = 32
# Operands on a 64-byte boundary (MKL's reproducibility notes ask for aligned operands); pieces start on one
# because the buffer is fresh and every piece holds a multiple of QUANTUM rows.
ALIGN = 64


class InvariantModeError(RuntimeError):
    """Batch-invariant mode cannot hold its guarantee on this machine (said at start, never served)."""


Call = Callable[[torch.Tensor, torch.Tensor], None]  # (x rows, out rows) -> writes out


@dataclass(frozen=True)
class RowPlan:
    """The row counts one matmul shape may be called with, all checked to give a row the reference's bits."""

    quantum: int
    sizes: tuple[int, ...]  # ascending; sizes[0] == quantum
    threads: int  # torch's intra-op threads when checked: other counts change MKL's partition

    def pieces(self, n: int) -> tuple[int, ...]:
        """Row counts of the calls that cover n rows (their sum >= n; the excess is padding), fewest rows +
        CALL_OVERHEAD_ROWS per call: a small dynamic program over quanta, memoized."""
        return _cover(-(-n // self.quantum), tuple(s // self.quantum for s in self.sizes),
                      CALL_OVERHEAD_ROWS / self.quantum, self.quantum)


@lru_cache(maxsize=4096)
def _cover(units: int, sizes: tuple[int, ...], overhead: float, quantum: int) -> tuple[int, ...]:
    best: list[float] = [0.0] + [float("inf")] * units
    pick = [0] * (units + 1)
    for u in range(1, units + 1):
        for s in sizes:
            c = best[max(0, u - s)] + s + overhead
            if c < best[u]:
                best[u], pick[u] = c, s
    out, u = [], units
    while u > 0:
        out.append(pick[u] * quantum)
        u = max(0, u - pick[u])
    return tuple(sorted(out, reverse=True))


def quantum_for(device: torch.device) -> int:
    return QUANTUM.get(device.type, DEFAULT_QUANTUM)


def candidates(quantum: int, max_rows: int) -> list[int]:
    """Checked counts up to the first one covering max_rows (the largest call the engine makes of this shape)."""
    out = []
    for k in LADDER:
        out.append(k * quantum)
        if k * quantum >= max_rows:
            break
    return out


def run_pieces(x: torch.Tensor, out_features: int, plan: RowPlan, call: Call) -> torch.Tensor:
    """x: [n, in] -> [n, out], each piece of plan.pieces(n) rows computed by one call. Full pieces read x in place
    when it is contiguous and aligned (a piece starts a multiple of QUANTUM rows in, so on a 64-byte boundary too);
    the piece holding the last rows, or every piece of an unaligned x, reads a zero-padded copy."""
    n, width = x.shape
    out = x.new_empty(n, out_features)
    direct = x.is_contiguous() and x.data_ptr() % ALIGN == 0
    if out.data_ptr() % ALIGN:  # the allocator aligns fresh tensors: never expected
        raise InvariantModeError("batch-invariant mode: the allocator returned a buffer off a 64-byte boundary")
    lo = 0
    for r in plan.pieces(n):
        hi = min(lo + r, n)
        if direct and hi - lo == r:
            call(x[lo:hi], out[lo:hi])
        else:
            xp = x.new_zeros(r, width)
            xp[:hi - lo] = x[lo:hi]
            op = x.new_empty(r, out_features)
            call(xp, op)
            out[lo:hi] = op[:hi - lo]
        lo = hi
    return out


@torch.inference_mode()
def calibrate(call: Call, in_features: int, out_features: int, dtype: torch.dtype, device: torch.device,
              max_rows: int, name: str) -> RowPlan:
    """The RowPlan of one matmul shape on this machine (see the module docstring). name: for the messages."""
    q = quantum_for(device)
    cands = candidates(q, max_rows)
    top = max(cands)
    g = torch.Generator(device="cpu").manual_seed(1234)
    x = torch.randn(top + q, in_features, generator=g).to(dtype=dtype, device=device)

    def rows(src: torch.Tensor, r: int) -> torch.Tensor:
        buf = src.new_empty(r, in_features)
        buf.copy_(src[:r])
        out = src.new_empty(r, out_features)
        call(buf, out)
        return out

    ref = torch.cat([rows(x[lo:], q) for lo in range(0, top + q, q)])
    # (a) the reference call: the same rows at other places in the call and beside other rows.
    shift = q // 2 + 1
    moved = torch.cat([rows(x[lo:], q) for lo in range(shift, top + 1, q)])
    if not torch.equal(moved, ref[shift:shift + len(moved)]):
        raise InvariantModeError(
            f"batch-invariant mode cannot start: on this machine ({machine_name(device)}, "
            f"{torch.get_num_threads()} threads) a {q}-row matmul of {name} ({in_features} -> {out_features}) "
            "gives a row other bits at another place in the call; run without batch_invariant, or with another "
            "num_threads")
    # (b) the counts that compute like the reference.
    ok = [r for r in cands if r == q or torch.equal(rows(x, r), ref[:r])]
    return RowPlan(q, tuple(ok), torch.get_num_threads())


def machine_name(device: torch.device | None = None) -> str:
    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"
