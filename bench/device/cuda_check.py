"""The engine on a GPU, in one short run: the prepared script for a lent CUDA machine (one try, minutes of device
time), whose CPU path the tests run so that it stays ready.

    python -m bench cuda_check [--plan] [--cpu-smoke] [--budget-s 540] [--out DIR] [--layers-8b 32] [--section ...]

On a lent GPU, bench/device/run.sh is the one command to call (torch 2.11 + triton 3.6 image, no Ray, no internet).
--plan prints each section's estimated seconds and GPU memory on one H200 and the total (PLAN), and runs nothing.

Sections, each in its own try (a failing one prints its traceback and the others still run), in this order:
  env        torch / transformers versions, device, free memory, TF32 flags, the engine's imports
  exact      float32: SmolLM2-135M-shaped Llama (30 layers) and a tiny Qwen2, random weights, scoring rows (top-5,
             several lengths, chunked prefill, a warm prefix-cache repeat) and 32-token greedy generation against a
             plain transformers forward / generate on the same device (bench/device/exact.py)
  bf16       bfloat16 scoring throughput and MFU of a random-weight Llama-3-8B-shaped model against a transformers
             forward of the same prompts (bench/device/bf16.py): dense, 64 x 512, every row
  ragged, prefill, mc, generate
             the workloads users send, on that model (bench/device/workloads.py): ragged scoring, the same as
             plain prefill, multiple choice with shared contexts, generation at batch 64 and 256 with and without
             CUDA graphs; tok/s, MFU (measured peak and spec) and peak memory of each side
  invariant  batch-invariant mode's checks and bits on the device (checks/invariant_device.py), small settings
  mla        a DeepSeek-V3-shaped model (4 layers, V3's latent widths): float32 rows and greedy against transformers,
             the varlen backend's kernel on the latent, bfloat16 scoring tok/s, latent bytes/token (bench/device/mla.py)
  gpt_oss    float32: a 4-layer gpt-oss (sinks, windows of 128, YaRN, biased experts) against transformers' eager
             forward: torch path, chunked, warm, greedy, and the varlen backend (Triton kernel: flash has no sinks);
             bfloat16: the automatic backend against the torch path (bench/device/gpt_oss.py)
  moe        only with --section moe (the default run fills its 540 s): one MoE layer's experts by the loop and
             by the grouped Triton kernel (bench/device/moe.py) at Qwen3-30B-A3B's and Qwen3-235B-A22B's layer
             shapes: bf16 ms at 16 and 2048 tokens, f32 max difference
  hybrid     only with --section hybrid: a Qwen3.5-shaped model (4 layers, the hub's linear-attention widths):
             float32 rows and greedy against transformers (one step, warm from state snapshots, chunked, varlen),
             bfloat16 prefill and decode tok/s on fla-core's kernels where fla imports (bench/device/hybrid.py)
Each section needs some seconds left to start (bf16 keeps 8 of the 32 layers when under 150 are left); once the
run passes --budget-s (540, PLAN's total with room: under a device call's 600 s) the sections left are skipped with
a note. On CUDA each section first checks that the GPU memory PLAN gives it is available (free plus what this run
holds), and is skipped with the reason when not (transformers' batch-256 generate checks its own static cache).
Without CUDA (or with --cpu-smoke) every shape is tiny: seconds on a CPU, figures meaningless.
Prints one summary table last; writes every figure to $OUT/cuda_check.json (default bench/results/).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class Run:
    """What every section sees: where it runs, how small, and the time left."""

    device: torch.device
    smoke: bool
    tmp: Path
    deadline: float  # time.perf_counter() past which no section starts
    layers_8b: int
    tf32_before: dict[str, bool]  # torch's TF32 flags as found, before exact_fp32() turned them off
    cache: dict[str, Any] = field(default_factory=dict)  # what sections share (the workloads' model and engine)

    def left(self) -> float:
        return self.deadline - time.perf_counter()


# Section: (estimated seconds on one H200, GPU GiB the run holds at the section's peak). Estimates, not
# measurements (no GPU has run them yet): the workloads' model build (random 8B-shaped weights, saved and loaded,
# ~75 s, graphs captured) is counted in ragged, the first to use it; bf16 builds its own copy. The memory: weights
# 15 GiB a copy (engine and transformers), the workloads' KV cache 24 GiB, transformers' logits of HF_TOKENS rows
# in bfloat16 and float32 (~11 GiB), the engine's scoring chunk (<= 4.4 GiB). Every section fits an 80 GB card.
PLAN: dict[str, tuple[float, float]] = {
    "env": (5, 0.1), "exact": (45, 4), "bf16": (90, 42), "ragged": (120, 70), "prefill": (20, 56),
    "mc": (25, 70), "generate": (90, 62), "invariant": (60, 4), "mla": (50, 8), "gpt_oss": (15, 4),
    "moe": (15, 12), "hybrid": (60, 10)}
# Run only when --section names them: the default run's sections fill the 540 s of one device call.
OPT_IN = frozenset({"moe", "hybrid"})
STARTUP_S = 20  # python and torch imports, CUDA context, the matmul peak measurement


def plan_lines(names: list[str]) -> list[str]:
    """--plan's table: each section's estimate, and the total with start-up."""
    lines = [f"{'section':<10} {'est. s':>7} {'GPU GiB':>8}", f"{'start-up':<10} {STARTUP_S:>7.0f} {'-':>8}"]
    for name in names:
        sec, gib = PLAN[name]
        lines.append(f"{name:<10} {sec:>7.0f} {gib:>8.1f}")
    total = STARTUP_S + sum(PLAN[n][0] for n in names)
    lines.append(f"{'total':<10} {total:>7.0f} {max(PLAN[n][1] for n in names):>8.1f}  (one H200; the most any "
                 f"section holds)")
    return lines


def memory_blocker(device: torch.device, gib: float) -> str | None:
    """Why gib of GPU memory is not there for a section (None: it is, or no CUDA): free plus what this process
    holds in torch's cache, which the section's predecessors release to it."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    available = (free + torch.cuda.memory_reserved(device)) / 2**30
    if gib > available:
        return (f"needs ~{gib:.0f} GiB of GPU memory, {available:.0f} GiB available of {total / 2**30:.0f} GiB on "
                f"this card")
    return None


def exact_fp32() -> None:
    """IEEE float32 matmuls on CUDA: TF32 would move logprobs by ~1e-3 (the engine sets the same on CUDA)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def env_section(run: Run) -> dict[str, Any]:
    import transformers

    out: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "cuda_available": torch.cuda.is_available(), "device": str(run.device),
                           "smoke": run.smoke}
    if run.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(run.device)
        out.update(name=torch.cuda.get_device_name(run.device), free_gib=free / 2**30, total_gib=total / 2**30,
                   capability=".".join(map(str, torch.cuda.get_device_capability(run.device))),
                   cuda=torch.version.cuda, tf32_before=run.tf32_before)
    else:
        from engine.invariant.row_plan import machine_name

        out["name"] = machine_name()
    # The engine's whole import graph (no Ray, no web framework), with this transformers.
    import engine.invariant.mode  # noqa: F401
    import engine.llm_engine  # noqa: F401
    import engine.models  # noqa: F401

    out["engine_imports"] = "ok"
    return out


def invariant_section(run: Run) -> dict[str, Any]:
    """checks/invariant_device.py's run, small: a SmolLM2-shaped checkpoint of 4 layers (the smoke run: a tiny
    Llama, whose start-up checks take seconds rather than SmolLM2's half minute on a CPU), float32 then (time
    allowing) bfloat16, each in both modes."""
    from bench.device.exact import SMOKE, SMOLLM2, build
    from checks import invariant_device as inv
    from engine.invariant.row_plan import machine_name

    if run.smoke:  # BESIDE's longest request is 700 tokens
        model = build("llama", {**SMOLLM2, **SMOKE, "max_position_embeddings": 1024}, run.tmp / "invariant")
    else:
        model = inv.smollm2_shaped(run.tmp / "invariant", 4)
    results: dict[str, Any] = {"machine": machine_name(run.device) if run.device.type == "cuda" else machine_name()}
    for dtype in ("float32", "bfloat16"):
        if dtype != "float32" and (run.smoke or run.left() < 60):
            results[f"{dtype}_skipped"] = "time budget" if not run.smoke else "smoke run"
            continue
        for invariant in (True, False):
            mode = "invariant" if invariant else "default"
            try:  # one mode failing (its start-up checks refusing this device, say) leaves the others' figures
                r = inv.mode_run(model, str(run.device), dtype, invariant, torch.get_num_threads())
            except Exception as e:
                traceback.print_exc()
                results[f"{dtype} {mode}_failed"] = f"{type(e).__name__}: {e}"[:300]
                continue
            results[f"{dtype} {mode}"] = r
            print(f"  invariant_device {dtype} {mode}: start {r['start_s']:.1f} s, cases {r['run_s']:.2f} s, "
                  f"bits moved in: {r['moved'] or 'none'}", flush=True)
    return results


def summary_rows(name: str, res: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(section, figure, value) lines of the table printed last."""
    if "error" in res or "skipped" in res:
        return [(name, "FAILED" if "error" in res else "skipped", str(res.get("error") or res.get("skipped")))]
    if "summary" in res:
        return [(name, figure, value) for figure, value in res["summary"]]
    if name == "env":
        free = f", {res['free_gib']:.0f}/{res['total_gib']:.0f} GiB free" if "free_gib" in res else ""
        return [(name, "device", f"{res['name']}{free}"),
                (name, "versions", f"torch {res['torch']}, transformers {res['transformers']}"),
                (name, "engine imports", res["engine_imports"])]
    if name == "exact":
        from bench.device.exact import summary

        return [(name, k, v) for k, v in summary(res)]
    if name == "gpt_oss":
        from bench.device.gpt_oss import summary as gpt_oss_summary

        return [(name, k, v) for k, v in gpt_oss_summary(res)]
    if name == "bf16":
        from bench.device.bf16 import summary as bf16_summary

        return [(name, k, v) for k, v in bf16_summary(res)]
    rows = []
    for key, r in res.items():
        if isinstance(r, dict):
            rows.append((name, key, f"moved: {r['moved'] or 'none'}; cases {r['run_s']:.2f} s"))
        elif key.endswith("_skipped"):
            rows.append((name, key.removesuffix("_skipped"), f"skipped ({r})"))
        elif key.endswith("_failed"):
            rows.append((name, key.removesuffix("_failed"), f"FAILED {r}"))
    return rows


def sections() -> dict[str, tuple[float | None, Callable[[Run], dict[str, Any]]]]:
    """name -> (seconds the section needs at least to start, None: always runs; its function)."""
    from bench.device import workloads as w
    from bench.device.bf16 import bf16_section
    from bench.device.exact import exact_section
    from bench.device.gpt_oss import gpt_oss_section
    from bench.device.hybrid import hybrid_section
    from bench.device.mla import mla_section
    from bench.device.moe import moe_section

    return {"env": (None, env_section), "exact": (30, exact_section), "bf16": (60, bf16_section),
            "ragged": (60, w.ragged_section), "prefill": (20, w.prefill_section), "mc": (30, w.mc_section),
            "generate": (45, w.generate_section), "invariant": (30, invariant_section), "mla": (40, mla_section),
            "gpt_oss": (15, gpt_oss_section),
            "moe": (20, moe_section), "hybrid": (40, hybrid_section)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench cuda_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (automatic without CUDA)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="no section starts after this many seconds")
    ap.add_argument("--plan", action="store_true", help="print each section's estimate and the total; run nothing")
    ap.add_argument("--layers-8b", type=int, default=32, help="layers of the Llama-3-8B-shaped model (of 32)")
    ap.add_argument("--section", action="append",
                    choices=list(PLAN),
                    help="repeat for several (default: all)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or Path(__file__).parents[1] / "results"))
    a = ap.parse_args(argv)
    if a.plan:
        print("\n".join(plan_lines([n for n in PLAN if n in a.section] if a.section else
                                    [n for n in PLAN if n not in OPT_IN])))
        return
    t0 = time.perf_counter()
    smoke = a.cpu_smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    tf32 = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
    exact_fp32()
    from transformers.utils import logging

    logging.disable_progress_bar()
    results: dict[str, Any] = {}
    table: list[tuple[str, str, str]] = []
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "cuda_check.json"
    with tempfile.TemporaryDirectory(prefix="rayscore-cuda-check-") as tmp:
        run = Run(device, smoke, Path(tmp), t0 + a.budget_s, a.layers_8b, tf32)
        for name, (needs_s, fn) in sections().items():
            if (name not in a.section) if a.section else name in OPT_IN:
                continue
            s0 = time.perf_counter()
            no_memory = memory_blocker(device, PLAN[name][1])
            if needs_s is not None and run.left() < needs_s:
                res: dict[str, Any] = {"skipped": f"{run.left():.0f} s left of --budget-s {a.budget_s:.0f}, "
                                                  f"the section needs {needs_s:.0f}"}
            elif no_memory is not None:
                res = {"skipped": no_memory}
            else:
                print(f"== {name} ({s0 - t0:.0f} s in)", flush=True)
                try:
                    res = fn(run)
                except Exception as e:  # the other sections still run
                    traceback.print_exc()
                    res = {"error": f"{type(e).__name__}: {e}"[:300]}
            res["wall_s"] = time.perf_counter() - s0
            results[name] = res
            table += summary_rows(name, res)
            path.write_text(json.dumps(results, indent=1, default=str))  # what is done survives a kill
            if name == "generate":  # the last workload section: its model and engine go
                run.cache.clear()
            gc.collect()  # the section's models go before the next one loads its own
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"\ncuda_check on {device} ({'CPU smoke: figures meaningless' if smoke else 'full'}), "
          f"{time.perf_counter() - t0:.0f} s; wrote {path}")
    width = max((len(r[0]) + len(r[1]) for r in table), default=10) + 3
    for section, figure, value in table:
        print(f"{section + ' | ' + figure:<{width}} | {value}")


if __name__ == "__main__":
    main()
