"""LoRA on the engine's (fused) linears, several adapters in one step: each resident adapter has a slot, each row
of the step's flat batch the slot of its request's adapter, and a Linear adds `x A^T B^T` (scaling folded into B)
to its adapter's rows, on weights stored transposed and contiguous. Base rows are never touched. Two forms, chosen
once per step by LoraStep.set() (vLLM's punica "segments" and its batched kernels, in plain torch):

- per segment (a run of consecutive rows of one adapter: a request's chunk, neighbours of the same adapter merged):
  `y[lo:hi].addmm_(x[lo:hi] @ Aᵀ, Bᵀ)`, two matmuls per segment, the delta accumulated into the output rows' view
  (no [rows, out] temporary). Costs about its flops when segments are long (prefill chunks).
- grouped (many short segments: decode rows, short prompts): each slot's rows gathered once into a padded
  [slots, L, in] batch, one bmm into the rank and one out of it, the result index_add_-ed to the rows. A fixed
  handful of kernels per Linear, however many segments: each small matmul of the per-segment form pays a kernel
  launch and, with several threads, OpenMP's fork and barrier. Pad rows repeat a real row and their rank
  activations are zeroed, so they add exact zeros.

A fused Linear (q/k/v, gate/up) holds each of its parts' adapters side by side: Aᵀ stacks the parts' ranks,
[S, in, parts x R], and Bᵀ is block-diagonal, [S, parts x R, out], so a part's output columns see only its own A.
Ranks below R are zero-padded, and a part an adapter does not target stays zero: adding exact zeros leaves those
columns as the base computed them.

With tensor parallelism (engine/parallel/shard.py) an adapter is written for the whole linear and each rank keeps its
share, as it keeps its share of the base weight (`Shard`): a column-parallel linear (q/k/v, gate/up) keeps the whole
A and the columns of Bᵀ of its own output rows (per part: its heads, its MLP rows); a row-parallel one (o, down)
keeps the columns of A of its own input features and the whole B, and its delta x_r A_rᵀ Bᵀ is a partial sum like
its base product, added before the all-reduce that sums them (Σ_r x_r A_rᵀ = x Aᵀ)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Segments shorter than this many rows per thread, on average, take the grouped form: the per-segment matmuls then
# cost more in launches and barriers than the gather/scatter of the grouped one (the crossover measured on CPU).
GROUPED_ROWS_PER_THREAD = 16


@dataclass
class LoraStep:
    """The step's rows by adapter slot, set once per step by the model runner (set()) and read by every Linear."""

    # (slot, first row, end row) of each run of consecutive rows of the flat batch whose requests use that slot
    segments: list[tuple[int, int, int]] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # the step's slots, ascending
    # The grouped form, None for the per-segment one: each slot's rows padded to the longest slot's count with
    # its last row, flat [n x L]; 1/0 for a real/pad row, [n, L, 1] (None: no pad); the slots as a slice of the
    # storage when consecutive (no copy), else their indices.
    rows: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    pick: slice | torch.Tensor = field(default_factory=lambda: slice(0))
    width: int = 0

    def set(self, segments: list[tuple[int, int, int]], dtype: torch.dtype, device: torch.device) -> None:
        self.segments = segments
        self.slots = sorted({slot for slot, _, _ in segments})
        self.rows = self.keep = None
        n_rows = sum(hi - lo for _, lo, hi in segments)
        if len(segments) < 2 or n_rows >= GROUPED_ROWS_PER_THREAD * torch.get_num_threads() * len(segments):
            return
        by_slot: dict[int, list[int]] = {slot: [] for slot in self.slots}
        for slot, lo, hi in segments:
            by_slot[slot].extend(range(lo, hi))
        self.width = max(len(rows) for rows in by_slot.values())
        self.rows = torch.tensor([rows + rows[-1:] * (self.width - len(rows)) for rows in by_slot.values()],
                                 device=device).flatten()
        if any(len(rows) < self.width for rows in by_slot.values()):
            self.keep = torch.tensor([[1.0] * len(rows) + [0.0] * (self.width - len(rows))
                                      for rows in by_slot.values()], dtype=dtype, device=device).unsqueeze(2)
        first = self.slots[0]
        consecutive = self.slots == list(range(first, first + len(self.slots)))
        self.pick = slice(first, first + len(self.slots)) if consecutive else torch.tensor(self.slots, device=device)


@dataclass(frozen=True)
class Shard:
    """A tensor-parallel rank's Linear as a share of the whole one (set by engine/parallel/shard.py); a Linear on one
    device has none. Adapters are read in the whole linear's shapes, and checked against them."""

    in_features: int  # the whole linear's
    parts: tuple[int, ...]  # the whole linear's output widths of its fused parts (q, k, v / gate, up / one)
    # Column parallel: the [lo, hi) ranges of the whole output's rows this rank computes, in its output's order.
    out_rows: tuple[tuple[int, int], ...] | None = None
    # Row parallel: the [lo, hi) of the whole input's features this rank multiplies.
    in_cols: tuple[int, int] | None = None


class LoraSlots:
    """One Linear's adapters, by slot. parts: the output widths of the linears fused into it, in order, as adapters
    are written (the whole linear's when `shard` is set); in_features: this Linear's own (a row-parallel rank's
    share)."""

    def __init__(self, step: LoraStep, in_features: int, parts: list[int], num_slots: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device, shard: Shard | None = None) -> None:
        self.step = step
        self.parts = parts
        self.offsets = [sum(parts[:i]) for i in range(len(parts))]
        self.max_rank = max_rank
        self.in_cols = shard.in_cols if shard is not None else None
        rows = shard.out_rows if shard is not None and shard.out_rows is not None else ((0, sum(parts)),)
        # Per part, (first column of its Bᵀ, first column of this Linear's output, count) of each run it keeps.
        self.columns = [_runs(rows, lo, lo + width) for lo, width in zip(self.offsets, parts, strict=True)]
        out = sum(hi - lo for lo, hi in rows)
        width = len(parts) * max_rank
        self.a_t = torch.zeros(num_slots, in_features, width, dtype=dtype, device=device)  # [S, in, P x R]
        self.b_t = torch.zeros(num_slots, width, out, dtype=dtype, device=device)  # [S, P x R, out]
        self.used = [False] * num_slots

    def set(self, slot: int, part: int, a: torch.Tensor, b: torch.Tensor, scaling: float) -> None:
        """Part `part`'s adapter in `slot`: a [r, in], b [parts[part], r] as PEFT stores them (the whole linear's:
        this Linear keeps its share)."""
        r = a.shape[0]
        lo = part * self.max_rank
        if self.in_cols is not None:
            a = a[:, self.in_cols[0]:self.in_cols[1]]
        self.a_t[slot, :, lo:lo + r] = a.t()
        b_t = (b * scaling).t()  # [r, parts[part]]
        for src, dst, n in self.columns[part]:
            self.b_t[slot, lo:lo + r, dst:dst + n] = b_t[:, src:src + n]
        self.used[slot] = True

    def clear(self, slot: int) -> None:
        self.a_t[slot].zero_()
        self.b_t[slot].zero_()
        self.used[slot] = False

    def add(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y: [T, out] the base output of x: [T, in]; adds each row's adapter delta in place and returns y."""
        step = self.step
        if step.rows is None:
            for slot, lo, hi in step.segments:
                if self.used[slot]:
                    y[lo:hi].addmm_(x[lo:hi] @ self.a_t[slot], self.b_t[slot])  # [n, in] -> [n, P x R] -> [n, out]
            return y
        if not any(self.used[slot] for slot in step.slots):  # no adapter of the step targets this Linear
            return y
        pick, n = step.pick, len(step.slots)
        a_t = self.a_t[pick] if isinstance(pick, slice) else self.a_t.index_select(0, pick)
        b_t = self.b_t[pick] if isinstance(pick, slice) else self.b_t.index_select(0, pick)
        xa = torch.bmm(x.index_select(0, step.rows).view(n, step.width, -1), a_t)  # [n, L, P x R]
        if step.keep is not None:
            xa.mul_(step.keep)  # pad rows add exact zeros to the row they repeat
        return y.index_add_(0, step.rows, torch.bmm(xa, b_t).view(n * step.width, -1))


def _runs(rows: tuple[tuple[int, int], ...], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Where the whole output's rows [lo, hi) (one part) land in a Linear made of `rows`: (offset in the part, column
    of the Linear's output, count) of each overlap."""
    runs, at = [], 0
    for r_lo, r_hi in rows:
        first, last = max(lo, r_lo), min(hi, r_hi)
        if first < last:
            runs.append((first - lo, at + first - r_lo, last - first))
        at += r_hi - r_lo
    return runs
