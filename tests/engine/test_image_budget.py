"""The step's image budget (engine/core/image_budget.py) on tiny random Qwen2.5-VL and Qwen3-VL checkpoints: a
budget of one image spreads a batch's towers over several steps and every scoring row and greedy token stays
transformers'; each step encodes at most the budget (what the scheduler planned, StepRecord.image_patches, equals what
the tower ran over) and the outputs held between steps stay within it; an image larger than the budget runs alone.
Then the scheduler's rules alone: a chunk cut before an image's run, first come first served, and a held output
counted until its run is computed."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.llm_engine import LLMEngine
from engine.multimodal.image_input import ImageInput
from engine.multimodal.request_images import RequestImages, VisionOutput
from protocol.outputs import RequestOutput, merge_outputs
from protocol.sampling import SamplingParams
from tests.engine.test_models_vision import FAMILIES, _diff, _prompt, vlm_path
from tests.helpers.engine import greedy, make_engine, scoring
from tests.helpers.tiny_vision import text_ids
from tests.helpers.vision_reference import vl_generate, vl_scores

ATOL = 1e-4
IMAGE = 9  # the placeholder id of the scheduler-only tests


def _held(eng: LLMEngine) -> int:
    return sum(s.images.held_patches for s in eng.scheduler.live() if s.images is not None)


def _run(eng: LLMEngine, prompts: list[list[int]], params: list[SamplingParams],
         images: list[list[ImageInput] | None]) -> tuple[list[RequestOutput], list[tuple[int, int]]]:
    """Steps the requests to completion; per step with work: (patches encoded, patches held after it)."""
    vision = eng.runner.vision
    assert vision is not None
    rids = [f"r{i}" for i in range(len(prompts))]
    for rid, ids, p, imgs in zip(rids, prompts, params, images, strict=True):
        eng.add_request(rid, ids, p, imgs)
    streams: dict[str, list[RequestOutput]] = {rid: [] for rid in rids}
    steps: list[tuple[int, int]] = []
    while eng.has_unfinished():
        before, records = vision.tower_patches, len(eng.counters.pending_steps)
        for out in eng.step():
            streams[out.request_id].append(out)
        eng.check_integrity()
        if len(eng.counters.pending_steps) > records:
            planned = eng.counters.pending_steps[-1].image_patches
            assert planned == vision.tower_patches - before, "the scheduler's plan is what the tower ran"
            steps.append((planned, _held(eng)))
    assert _held(eng) == 0, "finished requests hold no tower output"
    return [merge_outputs(streams[rid]) for rid in rids], steps


def _batch(family: str) -> tuple[list[list[int]], list[list[ImageInput] | None], list[SamplingParams]]:
    """Two image requests (two images each) scored, one generating, and a text-only request."""
    a, a_img = _prompt(family, ((150, 100), (100, 130)), [4, 15], seed=1)
    b, b_img = _prompt(family, ((100, 100), (130, 100)), [2, 12], seed=11)
    c, c_img = _prompt(family, ((150, 100),), [5], seed=2, length=12)
    text = text_ids(25, seed=5)
    return [a, b, c, text], [a_img, b_img, c_img, None], [scoring(0), scoring(3), greedy(6), scoring(0)]


def _check_rows(family: str, prompts: list[list[int]], images: list, outs: list[RequestOutput]) -> None:
    path = vlm_path(family)
    for ids, imgs, out, start in zip(prompts, images, outs, (0, 3, None, 0), strict=True):
        if start is None:
            assert out.new_token_ids == vl_generate(path, ids, imgs, 6)
        else:
            assert _diff(out.input_token_logprobs, ids, start, vl_scores(path, ids, imgs or [], start)) <= ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_budget_of_one_image_spreads_the_towers_and_keeps_every_row(family: str) -> None:
    prompts, images, params = _batch(family)
    biggest = max(i.num_patches for imgs in images if imgs for i in imgs)
    # Without a budget that binds, the first step encodes several images at once.
    free = make_engine(vlm_path(family), max_num_batched_tokens=64, max_num_seqs=4)
    _, free_steps = _run(free, prompts, params, images)
    assert max(p for p, _ in free_steps) > biggest
    eng = make_engine(vlm_path(family), max_num_batched_tokens=64, max_num_seqs=4,
                      max_image_patches_per_step=biggest)
    outs, steps = _run(eng, prompts, params, images)
    assert all(p <= biggest and held <= biggest for p, held in steps), steps
    assert sum(1 for p, _ in steps if p) >= 3, "five images of about a budget each need several steps"
    assert eng.runner.vision is not None and eng.runner.vision.tower_runs == 5
    _check_rows(family, prompts, images, outs)


@pytest.mark.parametrize("budget", [1, 40])
def test_an_image_larger_than_the_budget_runs_alone(budget: int) -> None:
    """Every image here has more patches than the budget: each runs in a step that encodes no other, while no
    output is held from an earlier step, and the rows are still transformers'."""
    family = "qwen2_5_vl"
    prompts, images, params = _batch(family)
    sizes = {i.num_patches for imgs in images if imgs for i in imgs}
    assert min(sizes) > budget
    eng = make_engine(vlm_path(family), max_num_batched_tokens=16, max_num_seqs=4, max_image_patches_per_step=budget)
    outs, steps = _run(eng, prompts, params, images)
    held_before = 0
    for planned, held in steps:
        assert planned == 0 or (planned in sizes and held_before == 0), steps
        held_before = held
    assert eng.runner.vision is not None and eng.runner.vision.tower_runs == 5
    _check_rows(family, prompts, images, outs)


def test_the_default_budget_follows_the_token_budget() -> None:
    assert EngineConfig(max_num_batched_tokens=100).image_patch_budget == 400  # 100 image tokens of 2 x 2 patches
    assert EngineConfig(max_image_patches_per_step=7).image_patch_budget == 7
    with pytest.raises(ValueError, match="max_image_patches_per_step must be positive"):
        EngineConfig(max_image_patches_per_step=0)
    eng = make_engine(vlm_path("qwen2_5_vl"), max_num_batched_tokens=16)
    assert eng.scheduler.images is not None and eng.scheduler.images.max_patches == 64
    eng.apply_runtime(eng.config.with_runtime({"max_num_batched_tokens": 8}))  # a worker's user_config
    assert eng.scheduler.images.max_patches == 32


# --- the scheduler's bookkeeping alone (no model: what the runner writes is set by hand) ---------------------------

def _image_seq(rid: str, at: int, grid: tuple[int, int, int] = (1, 4, 4), after: int = 4) -> Sequence:
    """`at` text ids, one image's run (grid (1, 4, 4): 16 patches, 4 tokens), `after` more text ids; scoring."""
    image = ImageInput.of(torch.zeros(grid[0] * grid[1] * grid[2], 8), grid)
    ids = [2] * at + [IMAGE] * image.num_tokens + [3] * after
    seq = Sequence(rid, ids, SamplingParams(max_tokens=0, return_logprob=True))
    seq.images = RequestImages(ids, [image], IMAGE)
    return seq


def _step(sched: Scheduler) -> list[tuple[str, int, int]]:
    """One step, its towers "run" (each image a chunk reaches gets an output, as the runner writes it), recorded."""
    out = sched.schedule()
    for c in out.chunks:
        images = c.seq.images
        if images is not None:
            for i, _ in images.needing_tower(c.start, c.num_tokens):
                images.outputs[i] = VisionOutput(torch.zeros(images.images[i].num_tokens, 1))
        sched.update(c, 0, None)
        if c.seq.num_computed_tokens == c.seq.num_tokens:
            sched.finish(c.seq)
    return [(c.seq.request_id, c.start, c.num_tokens) for c in out.chunks]


def test_a_chunk_is_cut_before_an_image_the_budget_cannot_take() -> None:
    kv = KVCacheManager(num_blocks=32, block_size=4, enable_prefix_cache=False)
    sched = Scheduler(kv, max_num_batched_tokens=100, max_num_seqs=8, max_image_patches=16)
    a, b, c = _image_seq("a", 2), _image_seq("b", 3), _image_seq("c", 1)
    for s in (a, b, c):
        sched.add(s)
    # a's image takes the budget; b goes up to its image's run; c, behind b, starts no image though none is held
    # by it (first come, first served) and computes its text before the run.
    assert _step(sched) == [("a", 0, 10), ("b", 0, 3), ("c", 0, 1)]
    assert a.is_finished and a.images is not None and a.images.outputs == [None]  # consumed, then ended: dropped
    assert _step(sched) == [("b", 3, 8)]  # b's image alone; c's waits behind it
    assert _step(sched) == [("c", 1, 8)]
    kv.check_integrity(sched.live())


def test_a_held_output_counts_until_its_run_is_computed() -> None:
    """a's image (32 patches, 8 tokens) is the whole budget and its chunks end inside its run: b, whose run comes
    first, is not admitted while a holds the output, though the token budget has room for it."""
    kv = KVCacheManager(num_blocks=32, block_size=4, enable_prefix_cache=False)
    sched = Scheduler(kv, max_num_batched_tokens=6, max_num_seqs=8, long_prefill_token_threshold=3,
                      max_image_patches=32)
    a, b = _image_seq("a", 2, grid=(1, 8, 4)), _image_seq("b", 0)
    sched.add(a)
    sched.add(b)
    assert _step(sched) == [("a", 0, 6)]  # a's run is 2 .. 9: its output is held after the step
    assert a.images is not None and a.images.held_patches == 32 and len(sched.waiting) == 1
    assert _step(sched) == [("a", 6, 6)]  # b still waits; a's run is now computed and its output dropped
    assert a.images.held_patches == 0
    assert _step(sched) == [("a", 12, 2), ("b", 0, 4)]
    kv.check_integrity(sched.live())
