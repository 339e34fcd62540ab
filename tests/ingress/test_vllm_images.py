"""vLLM 0.32's image inputs on its routes, on the real engine in process (a tiny random Qwen2.5-VL with its image
processor and a chat template): the token-in route's content_parts (token_ids holding one placeholder or the expanded
run, with and without a uuid) and the chat parts vLLM takes beyond OpenAI's (`image_url` as the URL itself,
`input_image`, an untyped part), each row within 1e-4 of transformers' float32 forward on the expanded prompt, greedy
tokens equal to its generate; a step budget that splits the prompt inside the image; and a 400 naming every image
form vLLM has that this server does not take (features, image_embeds, image_pil, audio and video, a uuid alone),
quoting no image."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import pytest
from PIL import Image

from engine.multimodal.image_input import ImageInput
from rulebook import images as img
from rulebook import vllm_media as vm
from tests.helpers.local_worker import local_client
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
from tests.helpers.vision_reference import vl_generate, vl_scores

FAMILY = "qwen2_5_vl"
ROUTE = "/inference/v1/generate"
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
PICTURE = random_image(84, 56, seed=5)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    path = build_tiny_vlm(tmp_path_factory.mktemp("vl") / FAMILY, FAMILY, seed=3)
    processor(FAMILY).save_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def client(folder: Path) -> httpx.AsyncClient:
    # A step budget of 5 tokens: the prefill's chunks end inside the image's run of 6 placeholders.
    return local_client(folder, max_num_batched_tokens=5, enable_prefix_cache=True)


def _data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image() -> ImageInput:
    return image_input(FAMILY, PICTURE)


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-4


def _rows(body: dict, ids: list[int]) -> list[float]:
    rows = body["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(ids)
    return [rows[p][str(ids[p])]["logprob"] for p in range(1, len(ids))]


@pytest.mark.parametrize("form", ["one placeholder", "expanded run", "with uuid"])
async def test_token_route_content_parts_score_exactly(client: httpx.AsyncClient, folder: Path, form: str) -> None:
    image = _image()
    ids = expand(text_ids(12, seed=6), [image], [5])  # vision_start at 5, the run, vision_end
    sent = ids if form == "expanded run" else ids[:6] + [IMAGE_TOKEN] + ids[6 + image.num_tokens:]
    part = {"type": "image_url", "url": _data_url(PICTURE), **({"uuid": "pic-1"} if form == "with uuid" else {})}
    r = await client.post(ROUTE, json={"token_ids": sent, "content_parts": [part], "return_token_ids": True,
                                       "sampling_params": {"max_tokens": 1, "prompt_logprobs": 0}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == ids and body["usage"]["prompt_tokens"] == len(ids)
    assert body["mm_placeholders"] == {"image": [{"offset": 6, "length": image.num_tokens}]}
    assert _close(_rows(body, ids), vl_scores(folder, ids, [image], 0))


async def test_token_route_greedy_and_id_rows(client: httpx.AsyncClient, folder: Path) -> None:
    """Generated tokens equal transformers' generate; prompt_logprob_token_ids rows count the expanded prompt."""
    image = _image()
    ids = expand(text_ids(10, seed=7), [image], [3])
    sent = ids[:4] + [IMAGE_TOKEN] + ids[4 + image.num_tokens:]
    parts = [{"type": "image_url", "url": _data_url(PICTURE)}]
    r = await client.post(ROUTE, json={"token_ids": sent, "content_parts": parts, "sampling_params": {
        "max_tokens": 5, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == vl_generate(folder, ids, [image], 5)
    start = 2
    rows = [[ids[start + i + 1]] for i in range(len(ids) - 1 - start)]
    r = await client.post(ROUTE, json={"token_ids": sent, "content_parts": parts, "sampling_params": {
        "max_tokens": 1, "prompt_logprob_token_ids": rows, "prompt_logprob_start": start}})
    assert r.status_code == 200, r.text
    import numpy as np

    got = np.load(io.BytesIO(base64.b64decode(r.json()["prompt_token_id_logprobs"])))[:, 0].tolist()
    assert _close(got, vl_scores(folder, ids, [image], start))


async def test_token_route_stream(client: httpx.AsyncClient, folder: Path) -> None:
    """A stream: the first chunk carries the expanded ids and the image's placeholder range; the tokens equal
    transformers' generate."""
    image = _image()
    ids = expand(text_ids(9, seed=8), [image], [2])
    sent = ids[:3] + [IMAGE_TOKEN] + ids[3 + image.num_tokens:]
    r = await client.post(ROUTE, json={"token_ids": sent, "stream": True, "return_token_ids": True,
                                       "content_parts": [{"type": "image_url", "url": _data_url(PICTURE)}],
                                       "sampling_params": {"max_tokens": 4, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and chunks[0]["prompt_token_ids"] == ids
    assert chunks[0]["mm_placeholders"] == {"image": [{"offset": 3, "length": image.num_tokens}]}
    assert "mm_placeholders" not in chunks[1]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == vl_generate(folder, ids, [image], 4)


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": "URL"},  # vLLM's: the URL itself
    {"type": "input_image", "image_url": "URL"},  # the Responses API's part
    {"image_url": {"url": "URL"}, "uuid": "pic-1"},  # untyped, with a uuid
])
async def test_chat_takes_vllms_image_parts(client: httpx.AsyncClient, folder: Path, part: dict) -> None:
    url = _data_url(PICTURE)
    part = {k: (url if v == "URL" else {"url": url} if v == {"url": "URL"} else v) for k, v in part.items()}
    r = await client.post("/v1/chat/completions", json={
        "max_tokens": 1, "prompt_logprobs": 0, "return_token_ids": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = body["prompt_token_ids"]
    start = ids.index(IMAGE_TOKEN)
    assert ids[start - 1] == VISION_START and ids[start + _image().num_tokens] == VISION_END
    assert _close(_rows(body, ids), vl_scores(folder, ids, [_image()], 0))


def _bad_token_bodies() -> list[tuple[dict, str, str]]:
    url = _data_url(PICTURE)
    ids = [5, VISION_START, IMAGE_TOKEN, VISION_END, 9]
    sp = {"max_tokens": 1}
    big = "A" * 200_000
    return [
        ({"token_ids": ids, "sampling_params": sp, "features": {"mm_hashes": {"image": ["h"]}, "mm_placeholders": {
            "image": [{"offset": 2, "length": 1}]}, "kwargs_data": {"image": [big]}}}, "features",
         "send the images as `content_parts` beside the same token_ids"),
        ({"token_ids": ids, "sampling_params": sp, "content_parts": [{"type": "audio_url", "url": url}]},
         "content_parts", "type 'audio_url'"),
        ({"token_ids": ids, "sampling_params": sp, "content_parts": [{"type": "image_url", "uuid": "u"}]},
         "content_parts", vm.UUID_ONLY.format(where="content_parts[0]")),
        ({"token_ids": ids, "sampling_params": sp, "content_parts": [{"type": "image_url", "url": url, "x": 1}]},
         "content_parts", "the key `x`"),
        ({"token_ids": ids, "sampling_params": sp, "content_parts": [big]}, "content_parts", "got a str"),
        ({"token_ids": ids, "sampling_params": sp, "content_parts": [{"type": "image_url", "url": url}] * 2},
         "content_parts", "1 image placeholder runs"),
        ({"token_ids": ids, "sampling_params": sp, "content_parts": [{"type": "image_url", "url": "https://x/a.png"}]},
         "content_parts", "allow_image_urls is off"),
        ({"token_ids": ids, "sampling_params": sp}, "content_parts", "for 0 images"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_token_bodies())))
async def test_token_route_refusals_name_the_field(client: httpx.AsyncClient, case: int) -> None:
    body, param, text = _bad_token_bodies()[case]
    r = await client.post(ROUTE, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and text in error["message"], error
    assert len(error["message"]) < 400  # no image, no serialized tensor quoted back


@pytest.mark.parametrize(("part", "text"), [
    ({"type": "image_embeds", "image_embeds": "A" * 100_000}, vm.IMAGE_EMBEDS.format(where="messages[0].content[1]")),
    ({"type": "image_pil", "image_pil": None}, vm.IMAGE_PIL.format(where="messages[0].content[1]")),
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}, "a `video_url` part"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "a `input_audio` part"),
    ({"image_embeds": "AAAA"}, "an `image_embeds` part"),  # untyped: typed by its payload, as vLLM types it
    ({"type": "image_url", "uuid": "pic-1"}, vm.UUID_ONLY.format(where="messages[0] image 0")),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "video_url": "x"},
     "with a `video_url`"),
])
async def test_chat_refuses_vllms_other_media(client: httpx.AsyncClient, part: dict, text: str) -> None:
    r = await client.post("/v1/chat/completions", json={
        "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and text in error["message"], error
    assert len(error["message"]) < 400


async def test_chat_refuses_vllms_multimodal_options(client: httpx.AsyncClient) -> None:
    for field in ("mm_processor_kwargs", "media_io_kwargs"):
        r = await client.post("/v1/chat/completions", json={
            "max_tokens": 1, field: {"max_pixels": 1000}, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = await client.post("/v1/chat/completions", json={
        "max_tokens": 1, "mm_processor_kwargs": {}, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


async def test_text_model_refuses_content_parts() -> None:
    from tests.helpers.openai_fakes import Backend, call

    backend = Backend()
    r = await call(backend, "POST", ROUTE, {"token_ids": [1, 2], "sampling_params": {"max_tokens": 1},
                                            "content_parts": [{"type": "image_url", "url": _data_url(PICTURE)}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == img.NO_IMAGES_HERE.format(n=1)
    assert backend.requests == []


async def test_qwen3_vl_moe_through_the_token_route(tmp_path: Path) -> None:
    """The MoE vision-language family served the same way: content_parts rows equal transformers'."""
    family = "qwen3_vl_moe"
    path = build_tiny_vlm(tmp_path / family, family, seed=4)
    processor(family).save_pretrained(path)
    image = image_input(family, PICTURE)
    ids = expand(text_ids(10, seed=9), [image], [4])
    sent = ids[:5] + [IMAGE_TOKEN] + ids[5 + image.num_tokens:]
    async with local_client(path, max_num_batched_tokens=3) as moe:
        r = await moe.post(ROUTE, json={"token_ids": sent, "return_token_ids": True,
                                        "sampling_params": {"max_tokens": 1, "prompt_logprobs": 0},
                                        "content_parts": [{"type": "image_url", "url": _data_url(PICTURE)}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == ids
    assert _close(_rows(body, ids), vl_scores(path, ids, [image], 0))
