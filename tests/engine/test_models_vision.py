"""Vision-language families (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) against transformers' float32 forward and
generate, on tiny random checkpoints (tests/helpers/tiny_vision.py): scoring rows with images, chunked prefill that
splits the text around and inside an image's placeholder run, greedy generation (M-RoPE positions after the prompt),
the vision tower run once per image per request, and text-only requests beside image requests (test_image_budget.py:
the step's image budget). The checkpoints hold the vision ids where real ones do, the last rows of a 49,156-row
vocabulary (tests/helpers/tiny_vision.py), with scaled weights and with transformers' own initialisation."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import pytest
import torch

from engine.async_engine import AsyncEngine
from engine.llm_engine import RequestError
from engine.multimodal.image_input import ImageInput
from engine.multimodal.placeholders import expand_placeholders
from engine.multimodal.request_images import RequestImages
from protocol.outputs import RequestOutput, merge_outputs
from tests.helpers.engine import greedy, make_engine, scoring
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_vision import (
    IMAGE_TOKEN,
    VISION_END,
    VISION_START,
    build_tiny_vlm,
    expand,
    image_input,
    random_image,
    text_ids,
)
from tests.helpers.vision_reference import vl_generate, vl_model, vl_scores

ATOL = 1e-4
FAMILIES = ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"]


@cache
def vlm_path(family: str, scaled: bool = True) -> Path:
    """The family's tiny checkpoint: weights scaled (every part moves the rows at 1e-4) or transformers' own init."""
    root = Path(tempfile.mkdtemp(prefix=f"rayscore-{family}-"))
    atexit.register(shutil.rmtree, root, True)
    return build_tiny_vlm(root / family, family, seed=20 + FAMILIES.index(family), scale=0.2 if scaled else None)


def _prompt(family: str, sizes: tuple[tuple[int, int], ...], at: list[int], seed: int = 0,
            length: int = 20) -> tuple[list[int], list[ImageInput]]:
    images = [image_input(family, random_image(w, h, seed + i)) for i, (w, h) in enumerate(sizes)]
    return expand(text_ids(length, seed), images, at), images


def _diff(got: list, ids: list[int], start: int, expected: list[float]) -> float:
    assert [t for _, t in got] == ids[start + 1:], "rows must align to input_ids[N+1:]"
    return max(abs(v - e) for (v, _), e in zip(got, expected, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_scoring_one_image_unchunked(family: str) -> None:
    path = vlm_path(family)
    ids, images = _prompt(family, ((150, 100),), [7])
    eng = make_engine(path, max_num_batched_tokens=1000)
    out = eng.generate([ids], scoring(0), check=True, images=[images])[0]
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(path, ids, images, 0)) <= ATOL
    assert eng.runner.vision is not None and eng.runner.vision.tower_runs == 1 == eng.stats().vision_tower_runs
    # The image is seen: another image behind the same placeholder ids scores differently.
    other = [image_input(family, random_image(150, 100, 99))]
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(path, ids, other, 0)) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_default_init_cold_and_cached(family: str) -> None:
    """Issue 48's checkpoint: transformers' own initialisation, vision ids 49152-49155. Rows within 1e-4 cold, then
    the same prompt again (cached past the image's run: no tower run), and chunked inside the run."""
    path = vlm_path(family, scaled=False)
    ids, images = _prompt(family, ((112, 84),), [7], seed=11)
    want = vl_scores(path, ids, images, 0)
    eng = make_engine(path, max_num_batched_tokens=1000, enable_prefix_cache=True)
    assert _diff(eng.generate([ids], scoring(0), check=True, images=[images])[0].input_token_logprobs, ids, 0,
                 want) <= ATOL
    hits = eng.kv.stats.hit_tokens
    out = eng.generate([ids], scoring(0), check=True, images=[images])[0]
    assert _diff(out.input_token_logprobs, ids, 0, want) <= ATOL
    assert eng.kv.stats.hit_tokens - hits > 8 + images[0].num_tokens  # past the run: served from the cache
    assert eng.runner.vision is not None and eng.runner.vision.tower_runs == 1
    chunked = make_engine(path, max_num_batched_tokens=5).generate([ids], scoring(0), check=True, images=[images])[0]
    assert _diff(chunked.input_token_logprobs, ids, 0, want) <= ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_are_transformers_rope_index(family: str) -> None:
    """The prompt's M-RoPE positions and the shift after it equal transformers' get_rope_index (two images, text
    between and after), placeholders marked by the checkpoint's image_token_id as the processor marks them."""
    path = vlm_path(family)
    ids, images = _prompt(family, ((150, 100), (100, 130)), [4, 15], seed=1)
    ours = RequestImages(ids, images, IMAGE_TOKEN)
    input_ids = torch.tensor([ids])
    model = vl_model(str(path)).model
    want, delta = model.get_rope_index(input_ids, (input_ids == model.config.image_token_id).int(),
                                       image_grid_thw=torch.tensor([im.grid_thw for im in images]))
    assert torch.equal(ours.prompt_positions, want[:, 0]) and ours.delta == int(delta)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("budget", [1, 3, 7, 16])
def test_scoring_chunked_inside_images(family: str, budget: int) -> None:
    """Two images; budgets that end chunks inside each placeholder run. The tower runs once per image."""
    path = vlm_path(family)
    ids, images = _prompt(family, ((150, 100), (100, 130)), [4, 15], seed=1)
    eng = make_engine(path, max_num_batched_tokens=budget)
    for start in (0, 9):
        out = eng.generate([ids], scoring(start), check=True, images=[images])[0]
        assert _diff(out.input_token_logprobs, ids, start, vl_scores(path, ids, images, start)) <= ATOL
    assert eng.runner.vision is not None and eng.runner.vision.tower_runs == 4  # 2 requests x 2 images


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_generate(family: str) -> None:
    """Generated tokens sit at index + the prompt's M-RoPE shift; greedy tokens equal transformers' generate, with
    the prefill chunked through the image."""
    path = vlm_path(family)
    ids, images = _prompt(family, ((150, 100),), [5], seed=2, length=12)
    eng = make_engine(path, max_num_batched_tokens=6)
    out = eng.generate([ids], greedy(8), check=True, images=[images])[0]
    assert out.new_token_ids == vl_generate(path, ids, images, 8)


@pytest.mark.parametrize("family", FAMILIES)
def test_text_requests_beside_image_requests(family: str) -> None:
    """Text-only requests in the same steps as image requests: each row as transformers (text-only prompts through
    the VL checkpoint with no image)."""
    path = vlm_path(family)
    ids, images = _prompt(family, ((100, 100),), [3], seed=3)
    text = text_ids(25, seed=5)
    eng = make_engine(path, max_num_batched_tokens=10, max_num_seqs=4)
    outs = eng.generate([text, ids, text], [scoring(0), scoring(2), greedy(4)], check=True,
                        images=[None, images, None])
    assert _diff(outs[0].input_token_logprobs, text, 0, vl_scores(path, text, [], 0)) <= ATOL
    assert _diff(outs[1].input_token_logprobs, ids, 2, vl_scores(path, ids, images, 2)) <= ATOL
    assert outs[2].new_token_ids == vl_generate(path, text, [], 4)


def test_placeholder_count_must_match_images() -> None:
    path = vlm_path("qwen2_5_vl")
    ids, images = _prompt("qwen2_5_vl", ((150, 100),), [7])
    eng = make_engine(path)
    with pytest.raises(RequestError, match="2 images"):
        eng.add_request("a", ids, scoring(0), images=images * 2)
    with pytest.raises(RequestError, match="needs 20"):
        eng.add_request("b", ids[:10] + ids[11:], scoring(0), images=images)


def test_text_model_refuses_images(tmp_path: Path) -> None:
    from tests.helpers.families import family_path
    eng = make_engine(family_path("qwen3"))
    _, images = _prompt("qwen2_5_vl", ((150, 100),), [7])
    with pytest.raises(RequestError, match="takes no images"):  # ids of its vocabulary, an image beside them
        eng.add_request("a", list(range(2, 40)), scoring(0), images=images)
    assert hf_scores  # the text families' reference stays importable beside the VL one


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_cache_keys_images(family: str) -> None:
    """Prefix cache on: a second image behind the same placeholder ids shares only the blocks before its run (and
    scores its own image exactly); the same image again is served from the cache with no tower run."""
    path = vlm_path(family)
    ids, first = _prompt(family, ((150, 100),), [9], seed=4)
    other = [image_input(family, random_image(150, 100, 77))]
    eng = make_engine(path, max_num_batched_tokens=16, enable_prefix_cache=True)
    vision = eng.runner.vision
    assert vision is not None
    runs = []
    for images in (first, other, first):
        hits = eng.kv.stats.hit_tokens
        out = eng.generate([ids], scoring(0), check=True, images=[images])[0]
        assert _diff(out.input_token_logprobs, ids, 0, vl_scores(path, ids, images, 0)) <= ATOL
        runs.append((eng.kv.stats.hit_tokens - hits, vision.tower_runs))
    block = eng.config.block_size
    assert runs[0] == (0, 1)
    assert runs[1] == (10 // block * block, 2)  # the blocks before the run (vision_start sits at index 9)
    assert runs[2][1] == 2 and runs[2][0] > 9 + first[0].num_tokens  # past the whole run: no tower


async def test_async_engine_carries_images() -> None:
    """The worker's API: an image request and a text request streamed at once, each row as transformers."""
    path = vlm_path("qwen2_5_vl")
    ids, images = _prompt("qwen2_5_vl", ((150, 100),), [6], seed=6)
    text = text_ids(18, seed=7)
    eng = AsyncEngine(engine=make_engine(path, max_num_batched_tokens=8))
    try:
        async def run(rid: str, prompt: list[int], imgs: list[ImageInput] | None) -> RequestOutput:
            return merge_outputs([o async for o in eng.generate(rid, prompt, scoring(0), images=imgs)])
        with_image, plain = await asyncio.gather(run("img", ids, images), run("txt", text, None))
    finally:
        eng.shutdown()
    assert _diff(with_image.input_token_logprobs, ids, 0, vl_scores(path, ids, images, 0)) <= ATOL
    assert _diff(plain.input_token_logprobs, text, 0, vl_scores(path, text, [], 0)) <= ATOL


def test_preempted_image_requests_recompute_exactly() -> None:
    """A KV pool too small for both requests: one is preempted (each time after its image was encoded) and
    recomputed; its tokens still equal generate. A preempted request holds no tower output while it waits (the image
    budget counts running requests only), so each recompute encodes its image again, as vLLM frees a preempted
    request's encoder outputs."""
    path = vlm_path("qwen2_5_vl")
    prompts = [_prompt("qwen2_5_vl", ((150, 100),), [5], seed=s, length=20) for s in (8, 9)]
    eng = make_engine(path, max_num_batched_tokens=16, num_kv_blocks=16)
    outs = eng.generate([ids for ids, _ in prompts], greedy(8), check=True, images=[im for _, im in prompts])
    assert eng.scheduler.num_preemptions > 0
    assert eng.runner.vision is not None and eng.runner.vision.tower_runs == 2 + eng.scheduler.num_preemptions
    for (ids, images), out in zip(prompts, outs, strict=True):
        assert out.new_token_ids == vl_generate(path, ids, images, 8)


def test_expand_placeholders_then_score() -> None:
    """A template's one placeholder per image, expanded to each image's run: the ids the engine scores."""
    family = "qwen2_5_vl"
    path = vlm_path(family)
    ids, images = _prompt(family, ((150, 100), (100, 130)), [4, 15], seed=1)
    short = text_ids(20, 1)
    short = short[:4] + [VISION_START, IMAGE_TOKEN, VISION_END] + short[4:15] + [VISION_START, IMAGE_TOKEN,
                                                                               VISION_END] + short[15:]
    assert expand_placeholders(short, images, IMAGE_TOKEN) == ids
    assert expand_placeholders(ids, images, IMAGE_TOKEN) == ids  # runs already expanded stay as they are
    with pytest.raises(ValueError, match="2 image placeholder runs .* for 1 images"):
        expand_placeholders(short, images[:1], IMAGE_TOKEN)
    eng = make_engine(path)
    out = eng.generate([expand_placeholders(short, images, IMAGE_TOKEN)], scoring(0), images=[images])[0]
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(path, ids, images, 0)) <= ATOL


def test_prefix_hit_ending_inside_an_image() -> None:
    """The cached blocks of a shorter prompt end inside the image's run: the longer prompt starts its prefill there
    (its tower runs for the rest of the run) and every row is still transformers'."""
    family = "qwen2_5_vl"
    path = vlm_path(family)
    ids, images = _prompt(family, ((150, 100),), [5], seed=10)
    run_end = 6 + images[0].num_tokens  # vision_start at 5, then the run
    block = 4
    head = ids[:run_end + 1]  # through vision_end
    boundary = len(head) // block * block
    assert 6 < boundary < run_end, "the shorter prompt's last full block must end inside the run"
    eng = make_engine(path, block_size=block, max_num_batched_tokens=16, enable_prefix_cache=True)
    eng.generate([head], scoring(0), check=True, images=[images])
    hits = eng.kv.stats.hit_tokens
    out = eng.generate([ids], scoring(0), check=True, images=[images])[0]
    assert eng.kv.stats.hit_tokens - hits == boundary
    assert eng.runner.vision is not None and eng.runner.vision.tower_runs == 2
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(path, ids, images, 0)) <= ATOL


def test_tied_embeddings_by_the_outer_config(tmp_path: Path) -> None:
    """transformers ties the LM head to the embeddings by the outer config's tie_word_embeddings (the checkpoint
    then holds no lm_head.weight): the engine loads and scores it the same."""
    path = build_tiny_vlm(tmp_path / "tied", "qwen3_vl", seed=5, tie=True)
    ids, images = _prompt("qwen3_vl", ((150, 100),), [7])
    out = make_engine(path, max_num_batched_tokens=8).generate([ids], scoring(0), images=[images])[0]
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(path, ids, images, 0)) <= ATOL
