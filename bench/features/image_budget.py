"""What the image budget (`max_image_patches_per_step`, engine/core/image_budget.py) bounds, measured: peak memory and
time of a batch of image requests with the budget off, at its default and at one image, in the same run.

    python -m bench image_budget [--sizes 448 1344] [--depth 2] [--smoke]

Checkpoint (random weights, float32, built with transformers' Qwen2.5-VL classes into a temporary folder): the vision
tower of Qwen2.5-VL-7B at its real widths (hidden 1280, MLP 3420, 16 heads, 14-pixel patches, 112-pixel windows, the
2 x 2 merger into 3,584) with `--depth` blocks, the last one full attention (the real tower has 32, four of them
full: the blocks run one after another, so depth moves time, not the peak), in front of one decoder layer of the 7B's
width (hidden 3,584, 28 query / 4 KV heads, M-RoPE sections 16/24/24; MLP 3,584 instead of 18,944, to keep the CPU
time of the text side small) and a 1,024-id vocabulary.

Workload per image size: `--requests` scoring requests (every row, N = 0) submitted together, each with `--images`
images of size x size pixels (448: 32 x 32 patches, 256 image tokens; 1344: 96 x 96 patches, 2,304 tokens) between
16-token texts (default: 6 requests of two 448² images, 2 requests of one 1344² image); max_num_batched_tokens 2048
(its default), max_num_seqs = requests. Sides: `off` (a budget no batch reaches: every image a step's chunks reach
is encoded in that step), `default` (4 x 2048 = 8,192 patches) and `one` (one image's patches; left out when that is
no less than the default, where `default` already runs each image alone). Peak: the CPU allocator's most bytes held
at once during the whole batch beyond what was alive before it (checks/cpu_peak.py; on CUDA
torch.cuda.max_memory_allocated), so the KV cache and weights are not in it.
Also per side: the batch's seconds (under the profiler, the same for every side), its longest step (what a decode
sharing the step waits), the most patches one step encoded, the most held between steps (as MiB of kept decoder
embeddings: patches / 4 x 3,584 x 4 bytes), and the largest |row difference| against the `off` side.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.lib.harness import set_threads
from checks.cpu_peak import peak_bytes

VOCAB = 1024
VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN = VOCAB - 4, VOCAB - 3, VOCAB - 2, VOCAB - 1
OUT_HIDDEN = 3584
OFF = 10**9  # patches no batch here reaches


def build(folder: Path, depth: int, smoke: bool) -> Path:
    """The scaled Qwen2.5-VL-7B checkpoint of the docstring (smoke: every width tiny) and a word-level tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    out = 64 if smoke else OUT_HIDDEN
    vision = dict(depth=depth, hidden_size=32 if smoke else 1280, intermediate_size=64 if smoke else 3420,
                  num_heads=2 if smoke else 16, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  window_size=112, out_hidden_size=out, fullatt_block_indexes=[depth - 1])
    text = dict(vocab_size=VOCAB, hidden_size=out, intermediate_size=out, num_hidden_layers=1,
                num_attention_heads=4 if smoke else 28, num_key_value_heads=2 if smoke else 4,
                max_position_embeddings=32768, rms_norm_eps=1e-6, eos_token_id=0, pad_token_id=1, bos_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                 "mrope_section": [2, 3, 3] if smoke else [16, 24, 24]})
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
                           video_token_id=VIDEO_TOKEN, vision_start_token_id=VISION_START,
                           vision_end_token_id=VISION_END)
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(cfg).save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    return folder


def batch(size: int, requests: int, images: int) -> tuple[list[list[int]], list[list[Any]]]:
    """Prompts of 16 text ids, then per image its run between vision_start and vision_end and 16 more ids; the images
    are random pixels through Qwen2.5-VL's image processor (PIL), as the ingress sends them."""
    import numpy as np
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from engine.multimodal.image_input import ImageInput

    proc = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                                    max_pixels=2048 * 2048)
    rng = np.random.default_rng(0)
    prompts, imgs = [], []
    for _ in range(requests):
        ids = rng.integers(2, VISION_START, 16).tolist()
        mine = []
        for _ in range(images):
            pixels = Image.fromarray((rng.random((size, size, 3)) * 255).astype("uint8"))
            got = proc(images=[pixels], return_tensors="pt")
            image = ImageInput.of(got["pixel_values"], tuple(got["image_grid_thw"][0].tolist()))
            mine.append(image)
            ids += [VISION_START] + [IMAGE_TOKEN] * image.num_tokens + [VISION_END]
            ids += rng.integers(2, VISION_START, 16).tolist()
        prompts.append(ids)
        imgs.append(mine)
    return prompts, imgs


def run_side(path: Path, prompts: list[list[int]], images: list[list[Any]], budget: int | None,
             device: str) -> dict[str, Any]:
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from protocol.sampling import SamplingParams

    eng = LLMEngine(EngineConfig(model=str(path), device=device, max_num_seqs=len(prompts), enable_prefix_cache=False,
                                 max_image_patches_per_step=budget, kv_cache_bytes=256 * 2**20))
    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)
    held: list[int] = []
    got: dict[str, list[float]] = {}

    def go() -> None:
        for i, (ids, imgs) in enumerate(zip(prompts, images, strict=True)):
            eng.add_request(f"r{i}", ids, params, imgs)
        while eng.has_unfinished():
            for out in eng.step():
                got.setdefault(out.request_id, []).extend(v for v, _ in out.input_token_logprobs)
            held.append(sum(s.images.held_patches for s in eng.scheduler.live() if s.images is not None))

    t0 = time.perf_counter()
    if eng.device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        go()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = peak_bytes(go)
    wall = time.perf_counter() - t0
    steps = eng.counters.drain_steps()
    return {"budget": eng.scheduler.images.max_patches if eng.scheduler.images else None, "peak_b": peak,
            "wall_s": wall, "longest_step_s": max(s.duration_s for s in steps), "steps": len(steps),
            "max_step_patches": max(s.image_patches for s in steps), "max_held_patches": max(held),
            "rows": [v for i in range(len(prompts)) for v in got[f"r{i}"]]}


HEAD = ("| image | requests x images | side | budget (patches) | peak MiB | peak / off | most patches in a step | "
        "most held (MiB of embeddings) | steps | batch s | longest step s | longest step / off | max row diff | "
        "load 1 / 5 / 15 min |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def row(r: dict[str, Any], off: dict[str, Any], out_hidden: int) -> str:
    """One side's line of the table, against the `off` side of the same size, with the load average as it ends."""
    load = os.getloadavg()
    held_mib = r["max_held_patches"] / 4 * out_hidden * 4 / 2**20
    budget = "off" if r["side"] == "off" else f"{r['budget']:,}"
    diff = max(abs(x - y) for x, y in zip(r["rows"], off["rows"], strict=True))
    return (f"| {r['size']}² | {r['shape']} | {r['side']} | {budget} | {r['peak_b'] / 2**20:,.0f} | "
            f"{r['peak_b'] / off['peak_b']:.2f}x | {r['max_step_patches']:,} | {r['max_held_patches']:,} "
            f"({held_mib:,.0f}) | {r['steps']} | {r['wall_s']:.1f} | {r['longest_step_s']:.1f} | "
            f"{r['longest_step_s'] / off['longest_step_s']:.2f}x | {diff:.1e} | "
            f"{load[0]:.0f} / {load[1]:.0f} / {load[2]:.0f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench image_budget", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[448, 1344], help="image sides in pixels")
    ap.add_argument("--requests", type=int, nargs="+", default=[6, 2], help="requests per size (in --sizes order)")
    ap.add_argument("--images", type=int, nargs="+", default=[2, 1], help="images per request, per size")
    ap.add_argument("--depth", type=int, default=2, help="vision tower blocks (the last one full attention)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny widths and images, to check that the tool runs")
    a = ap.parse_args(argv)
    set_threads(a.threads)
    if a.smoke:
        a.sizes, a.requests, a.images = [112, 224], [3, 2], [2, 1]
    out_hidden = 64 if a.smoke else OUT_HIDDEN
    print(f"Qwen2.5-VL-7B tower widths, depth {a.depth}; {a.threads} threads on {a.device}; each row printed as its "
          "side ends, with the machine's load average then")
    print(HEAD, flush=True)
    with tempfile.TemporaryDirectory(prefix="rayscore-image-budget-") as tmp:
        path = build(Path(tmp), a.depth, a.smoke)
        for size, requests, per in zip(a.sizes, a.requests, a.images, strict=True):
            prompts, images = batch(size, requests, per)
            one = images[0][0].num_patches
            default = 4 * 2048  # EngineConfig's, at max_num_batched_tokens 2048
            sides: list[tuple[str, int | None]] = [("off", OFF), ("default", None)]
            if one < default:  # else `one` plans what `default` does: each image alone
                sides.append(("one", one))
            off: dict[str, Any] | None = None
            for side, budget in sides:
                r = {**run_side(path, prompts, images, budget, a.device), "size": size, "side": side,
                     "shape": f"{requests} x {per}"}
                off = off or r
                print(row(r, off, out_hidden), flush=True)
