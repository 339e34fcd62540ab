"""Images over HTTP on the real Serve app (real local Ray cluster): a tiny random Qwen2.5-VL served with one config
line (`model:` its folder) answers an OpenAI chat completion with an image_url part and prompt_logprobs, and SGLang's
/generate with image_data (input_ids holding the placeholder run expanded, as slime and verl send it, or one
placeholder the server expands), every row within 1e-4 of transformers' float32 forward, cold and cached; a
decompression bomb is a 400 naming max_image_pixels while a concurrent text request is answered exactly.
One app deployment for the whole file (the e2e tier's time budget)."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from PIL import Image
from ray import serve

from tests.helpers.serve import app_args, deploy
from tests.helpers.tiny_vision import (
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
from tests.helpers.vision_reference import vl_scores

ATOL = 1e-4
FAMILY = "qwen2_5_vl"
# A chat template that writes each message's content as it is (the ingress puts the image ids where its part sat).
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _served_folder(tmp_path: Path) -> Path:
    """The checkpoint with what a real VLM folder holds beside the weights: its image processor and chat template."""
    from transformers import AutoTokenizer

    path = build_tiny_vlm(tmp_path / FAMILY, FAMILY, seed=3)
    processor(FAMILY).save_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return path


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


def test_images_served_exactly(serve_url: str, tmp_path: Path) -> None:
    path = _served_folder(tmp_path)
    name = "vision-qwen2-5-vl"
    deploy(name, f"/{name}", app_args(model=str(path), model_name=name, num_workers=1, kv_cache_mb=8))
    url = f"{serve_url}/{name}"
    picture = random_image(84, 56, seed=5)
    image = image_input(FAMILY, picture)
    png = _png(picture)
    try:
        # OpenAI chat: an image_url part between two text parts; prompt_logprobs covers the expanded prompt.
        chat = {"model": name, "max_tokens": 1, "prompt_logprobs": 0, "return_token_ids": True, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": _data_url(png)}},
                                         {"type": "text", "text": "what is it"}]}]}
        for _ in ("cold", "cached"):
            r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120)
            assert r.status_code == 200, r.text
            out = r.json()
            ids = out["prompt_token_ids"]
            start = ids.index(IMAGE_TOKEN)
            assert ids[start - 1] == VISION_START and ids[start + image.num_tokens] == VISION_END
            assert ids.count(IMAGE_TOKEN) == image.num_tokens
            rows = out["prompt_logprobs"]
            assert rows[0] is None and len(rows) == len(ids)
            got = [rows[p][str(ids[p])]["logprob"] for p in range(1, len(ids))]
            assert _close(got, vl_scores(path, ids, [image], 0))

        # SGLang /generate: input_ids with the run already expanded, and with one placeholder the server expands.
        body_ids = expand(text_ids(20, seed=6), [image], [7])
        one = body_ids[:8] + [IMAGE_TOKEN] + body_ids[8 + image.num_tokens:]
        want = vl_scores(path, body_ids, [image], 0)
        for sent, data in ((body_ids, base64.b64encode(png).decode()), (one, _data_url(png)), (body_ids, [
                _data_url(png)])):
            body = {"input_ids": sent, "image_data": data, "return_logprob": True, "logprob_start_len": 0,
                    "sampling_params": {"max_new_tokens": 0}}
            r = httpx.post(f"{url}/generate", json=body, timeout=120)
            assert r.status_code == 200, r.text
            meta = r.json()["meta_info"]
            entries = meta["input_token_logprobs"]
            assert [e[1] for e in entries] == body_ids and entries[0][0] is None
            assert _close([e[0] for e in entries[1:]], want)
        assert meta["cached_tokens"] > 0  # the same image and ids: its blocks come from the prefix cache

        # A decompression bomb is a 400 naming the limit, while a concurrent text request is answered exactly.
        text = text_ids(24, seed=8)
        text_body = {"input_ids": text, "return_logprob": True, "logprob_start_len": 0,
                     "sampling_params": {"max_new_tokens": 0}}
        bomb = {**chat, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _data_url(_bomb(40_000, 40_000))}}]}]}
        with ThreadPoolExecutor(2) as pool:
            bad = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=bomb, timeout=120)
            good = pool.submit(httpx.post, f"{url}/generate", json=text_body, timeout=120)
            bad_r, good_r = bad.result(), good.result()
        assert bad_r.status_code == 400 and "max_image_pixels" in bad_r.json()["error"]["message"], bad_r.text
        assert good_r.status_code == 200, good_r.text
        assert _close([e[0] for e in good_r.json()["meta_info"]["input_token_logprobs"][1:]],
                      vl_scores(path, text, [], 0))
        # Undecodable bytes and a placeholder count that does not match: 400s, the message quoting no image.
        junk = {"input_ids": body_ids, "image_data": base64.b64encode(b"not an image" * 1000).decode(),
                "sampling_params": {"max_new_tokens": 1}}
        r = httpx.post(f"{url}/generate", json=junk, timeout=60)
        assert r.status_code == 400 and "can decode" in r.text and len(r.text) < 600, r.text
        r = httpx.post(f"{url}/generate", json={**junk, "image_data": [_data_url(png)] * 2}, timeout=60)
        assert r.status_code == 400 and "1 image placeholder runs" in r.text and len(r.text) < 600, r.text
    finally:
        serve.delete(name)
