"""Images over HTTP on the real Serve app (real local Ray cluster): a tiny random Qwen2.5-VL and a tiny random
Qwen3-VL, each served from the test config with one line changed (`model:` its folder; one worker, so that the
worker's counters are the app's), answer
- an OpenAI chat completion with an image_url part, `prompt_logprobs`, `echo` and `logprobs` (greedy tokens and
  their logprobs, and every prompt row, within 1e-4 of transformers' float32 forward), cold and cached;
- SGLang's /generate with image_data beside `input_ids` (the run expanded, as slime and verl send it, or one
  placeholder the server expands) and beside `text` (the tokenizer spells the family's image tokens), cold and cached;
with the vision tower run once per image (the worker's `vision_tower_runs`: the same image and prompt again is served
from the prefix cache); a decompression bomb is a 400 naming max_image_pixels while a concurrent text request is
answered exactly. Both apps start together, once for the file (the e2e tier's time budget)."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from ray import serve

from engine.multimodal.image_input import ImageInput
from protocol import expand_runs
from tests.helpers.serve import app_args, sse_events, wait_ready, worker_stats
from tests.helpers.tiny_vision import (
    CHAT_TEMPLATE,
    IMAGE_TOKEN,
    VISION_END,
    VISION_START,
    build_tiny_vlm,
    expand,
    image_input,
    processor,
    random_image,
    text_ids,
)
from tests.helpers.vision_reference import vl_generate, vl_scores

ATOL = 1e-4
FAMILIES = ["qwen2_5_vl", "qwen3_vl"]
# What the hub's preprocessor_config.json names (Qwen3-VL's names the fast, torchvision class: the ingress loads
# the PIL one in its place).
HUB_PROCESSOR = {"qwen2_5_vl": ("Qwen2VLImageProcessor", "Qwen2_5_VLProcessor"),
                 "qwen3_vl": ("Qwen2VLImageProcessorFast", "Qwen3VLProcessor")}


@dataclass(frozen=True)
class Served:
    family: str
    name: str
    url: str
    path: Path


def _served_folder(root: Path, family: str) -> Path:
    """The checkpoint with what a real VLM folder holds beside the weights: its image processor (under the hub's
    class names) and Qwen's chat template. As a new user's random checkpoint: transformers' own initialisation, the
    vision ids the last rows of the vocabulary (issue 48; the in-process tests, ingress's too, also run scaled
    weights)."""
    from transformers import AutoTokenizer

    path = build_tiny_vlm(root / family, family, seed=3 + FAMILIES.index(family), scale=None)
    processor(family).save_pretrained(path)
    config = json.loads((path / "preprocessor_config.json").read_text())
    config["image_processor_type"], config["processor_class"] = HUB_PROCESSOR[family]
    (path / "preprocessor_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def apps(serve_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    root = tmp_path_factory.mktemp("vision")
    served = {f: Served(f, f"vision-{f}", f"{serve_url}/vision-{f}", _served_folder(root, f)) for f in FAMILIES}
    from deploy.app import build_app

    for s in served.values():  # both start at once
        serve.run(build_app(app_args(model=str(s.path), num_workers=1)), name=s.name, route_prefix=f"/{s.name}",
                  blocking=False)
    try:
        for s in served.values():
            wait_ready(s.name)
        yield served
    finally:
        for s in served.values():
            serve.delete(s.name)


@pytest.fixture(params=FAMILIES)
def app(request: pytest.FixtureRequest, apps: dict[str, Served]) -> Served:
    return apps[request.param]


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _bomb(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels with (almost) no pixel data: decoding it would allocate
    width * height * 3 bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want, strict=True)) <= ATOL


def _scored(app: Served, prompt: dict[str, Any], ids: list[int], want: list[float]) -> dict[str, Any]:
    """SGLang's /generate scoring `prompt` (its ids or text, and its image_data) from position 0: the rows are the
    expanded `ids`, each within 1e-4 of `want`; the answer's meta_info."""
    body = {**prompt, "return_logprob": True, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 0}}
    r = httpx.post(f"{app.url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    entries = meta["input_token_logprobs"]
    assert [e[1] for e in entries] == ids and entries[0][0] is None
    assert _close([e[0] for e in entries[1:]], want)
    return meta


def _counters(app: Served) -> tuple[int, int]:
    """(images through the vision tower, prefix-cache hit tokens) of the app's one worker."""
    (stats,) = worker_stats(app.name, samples=2).values()
    return stats.vision_tower_runs, stats.prefix_cache_hit_tokens


def _picture(app: Served, seed: int) -> tuple[ImageInput, bytes]:
    picture = random_image(84, 56, seed=seed)
    return image_input(app.family, picture), _png(picture)


def test_chat_with_an_image_cold_and_cached(app: Served) -> None:
    """An image_url part between two text parts, after it the assistant's last turn: prompt_logprobs covers the
    expanded prompt, echo starts the answer with that turn, logprobs are the greedy tokens' own."""
    image, png = _picture(app, seed=5)
    chat = {"max_tokens": 2, "temperature": 0, "ignore_eos": True, "prompt_logprobs": 0, "return_token_ids": True,
            "echo": True, "logprobs": True, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image_url", "image_url": {"url": _data_url(png)}},
                                             {"type": "text", "text": "what is it"}]},
                {"role": "assistant", "content": "It is"}]}
    answers = []
    for cold in (True, False):
        runs, hits = _counters(app)
        r = httpx.post(f"{app.url}/v1/chat/completions", json=chat, timeout=120)
        assert r.status_code == 200, r.text
        out = r.json()
        ids = out["prompt_token_ids"]
        start = ids.index(IMAGE_TOKEN)
        assert ids[start - 1] == VISION_START and ids[start + image.num_tokens] == VISION_END
        assert ids.count(IMAGE_TOKEN) == image.num_tokens
        rows = out["prompt_logprobs"]
        assert rows[0] is None and len(rows) == len(ids)
        got = [rows[p][str(ids[p])]["logprob"] for p in range(1, len(ids))]
        assert _close(got, vl_scores(app.path, ids, [image], 0))
        (choice,) = out["choices"]
        generated = choice["token_ids"]
        assert generated == vl_generate(app.path, ids, [image], 2)
        assert _close([e["logprob"] for e in choice["logprobs"]["content"]],
                      vl_scores(app.path, ids + generated, [image], len(ids) - 1))
        assert choice["message"]["content"].startswith("It is") and len(choice["logprobs"]["content"]) == 2
        after, after_hits = _counters(app)
        # Cold: the tower runs once for the image; cached: every block of the image's run is a prefix-cache hit, so
        # it does not run at all.
        assert after - runs == (1 if cold else 0)
        assert (after_hits - hits >= start + image.num_tokens) is not cold
        answers.append(out)
    assert answers[0]["choices"] == answers[1]["choices"]
    # Streamed: the first delta starts with the echo, the deltas join to the same message, the tower stays idle.
    runs, _ = _counters(app)
    stream = {k: v for k, v in chat.items() if k not in ("prompt_logprobs", "return_token_ids")}
    r = httpx.post(f"{app.url}/v1/chat/completions", json={**stream, "stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    deltas = [e["choices"][0] for e in sse_events(r)[:-1]]
    assert deltas[0]["delta"]["content"].startswith("It is")
    assert "".join(d["delta"]["content"] for d in deltas) == answers[0]["choices"][0]["message"]["content"]
    assert _counters(app)[0] == runs


def test_sglang_image_data_beside_ids_and_text(app: Served) -> None:
    from transformers import AutoTokenizer

    image, png = _picture(app, seed=6)
    body_ids = expand(text_ids(20, seed=6), [image], [7])
    one = body_ids[:8] + [IMAGE_TOKEN] + body_ids[8 + image.num_tokens:]
    want = vl_scores(app.path, body_ids, [image], 0)
    runs, _ = _counters(app)
    for sent, data in ((body_ids, base64.b64encode(png).decode()), (one, _data_url(png)), (body_ids, [
            _data_url(png)])):
        meta = _scored(app, {"input_ids": sent, "image_data": data}, body_ids, want)
    assert meta["cached_tokens"] > 0  # the same image and ids: its blocks come from the prefix cache
    assert _counters(app)[0] - runs == 1  # three requests, one tower run

    # `text` holding the family's image tokens as a chat template writes them: the tokenizer spells them.
    text = "Describe <|vision_start|><|image_pad|><|vision_end|> in a few words, please, with care."
    tok = AutoTokenizer.from_pretrained(app.path)
    ids = expand_runs(tok.encode(text, add_special_tokens=False), [image.num_tokens], IMAGE_TOKEN)
    want = vl_scores(app.path, ids, [image], 0)
    for cold in (True, False):
        runs, _ = _counters(app)
        meta = _scored(app, {"text": text, "image_data": _data_url(png)}, ids, want)
        assert (meta["cached_tokens"] > 0) is not cold
        assert _counters(app)[0] - runs == (1 if cold else 0)


def test_bad_images_are_400s_while_text_is_answered(app: Served) -> None:
    """A decompression bomb is a 400 naming the limit, while a concurrent text request is answered exactly;
    undecodable bytes and a placeholder count that does not match are 400s quoting no image."""
    image, png = _picture(app, seed=7)
    text = text_ids(24, seed=8)
    text_body = {"input_ids": text, "return_logprob": True, "logprob_start_len": 0,
                 "sampling_params": {"max_new_tokens": 0}}
    bomb = {"max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _data_url(_bomb(40_000, 40_000))}}]}]}
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(httpx.post, f"{app.url}/v1/chat/completions", json=bomb, timeout=120)
        good = pool.submit(httpx.post, f"{app.url}/generate", json=text_body, timeout=120)
        bad_r, good_r = bad.result(), good.result()
    assert bad_r.status_code == 400 and "max_image_pixels" in bad_r.json()["error"]["message"], bad_r.text
    assert good_r.status_code == 200, good_r.text
    assert _close([e[0] for e in good_r.json()["meta_info"]["input_token_logprobs"][1:]],
                  vl_scores(app.path, text, [], 0))
    body_ids = expand(text_ids(20, seed=9), [image], [7])
    junk = {"input_ids": body_ids, "image_data": base64.b64encode(b"not an image" * 1000).decode(),
            "sampling_params": {"max_new_tokens": 1}}
    r = httpx.post(f"{app.url}/generate", json=junk, timeout=60)
    assert r.status_code == 400 and "can decode" in r.text and len(r.text) < 600, r.text
    r = httpx.post(f"{app.url}/generate", json={**junk, "image_data": [_data_url(png)] * 2}, timeout=60)
    assert r.status_code == 400 and "1 image placeholder runs" in r.text and len(r.text) < 600, r.text
