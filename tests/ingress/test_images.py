"""Image input in the ingress: data: URLs and SGLang's image_data forms, decoding and preprocessing with the real
image processor (transformers' PIL Qwen2-VL processor saved in a folder, as a served model's folder holds it), each
limit's 400 naming it, placeholder expansion, and refusals that quote at most a short prefix of a client's value."""

from __future__ import annotations

import base64
import io
import struct
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from engine.multimodal.image_input import ImageInput
from engine.multimodal.placeholders import expand_placeholders
from ingress.errors import InvalidRequest
from ingress.images import (
    ImageBlob,
    ImageLimits,
    ImageSide,
    expanded,
    from_data_url,
    from_image_data,
    image_limits,
    prepare_images,
)
from ingress.openai.chat import template_messages
from ingress.openai.schemas.chat import ChatMessage
from ingress.settings import IngressSettings
from ingress.sglang.translate import image_blobs, parse
from ingress.text import IMAGE_MARKER
from protocol import ModelInfo
from rulebook import images as img
from rulebook import sglang as sg
from tests.helpers.tiny_vision import image_input, processor, random_image

LIMITS = ImageLimits(max_images_per_request=2, max_image_pixels=200 * 200)
IMAGE_TOKEN = 7
INFO = ModelInfo("vl", 100, 64, "raw_logprobs", image_token_id=IMAGE_TOKEN, vision_start_token_id=5,
                 vision_end_token_id=6)


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> ImageSide:
    folder = tmp_path_factory.mktemp("vl")
    processor("qwen2_5_vl").save_pretrained(folder)
    return ImageSide(ModelInfo("vl", 100, 64, "raw_logprobs", model_path=str(folder)))


def _encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def _bomb(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _blob(data: bytes) -> ImageBlob:
    return ImageBlob(data, "image 0", "messages")


def _refused(side: ImageSide, data: bytes) -> str:
    with pytest.raises(InvalidRequest) as err:
        side.prepare([_blob(data)], LIMITS)
    return err.value.message


def test_patches_and_digest_equal_the_engines_own(side: ImageSide) -> None:
    picture = random_image(84, 56, seed=1)
    (got,) = side.prepare([_blob(_encoded(picture))], LIMITS)
    want = image_input("qwen2_5_vl", picture)
    engine_side = ImageInput.from_carrier(got)
    assert got.grid_thw == want.grid_thw and got.num_tokens == want.num_tokens
    assert engine_side.pixel_values.equal(want.pixel_values) and got.digest == want.digest == engine_side.digest


def test_a_different_image_has_a_different_digest(side: ImageSide) -> None:
    a, b = side.prepare([_blob(_encoded(random_image(84, 56, seed=1))), _blob(_encoded(random_image(84, 56, 2)))],
                        LIMITS)
    assert a.digest != b.digest


def test_undecodable_bytes(side: ImageSide) -> None:
    message = _refused(side, b"\x00not an image" * 10_000)
    assert message == img.UNDECODABLE.format(where="image 0", reason="no image format recognised")


def test_truncated_image(side: ImageSide) -> None:
    data = _encoded(random_image(84, 56, seed=3))
    assert "is not an image this server can decode" in _refused(side, data[: len(data) // 2])


def test_unsupported_format(side: ImageSide) -> None:
    message = _refused(side, _encoded(random_image(30, 30, seed=4), "TIFF"))
    assert message == img.FORMAT.format(where="image 0", fmt="TIFF", formats=", ".join(img.IMAGE_FORMATS))


@pytest.mark.parametrize(("width", "height"), [(201, 200), (40_000, 40_000)])
def test_pixel_limit_from_the_header(side: ImageSide, width: int, height: int) -> None:
    """Both a plain over-limit image and a bomb whose header claims 1.6 gigapixels are refused naming the limit,
    before decoding (decoding the bomb would allocate 4.8 GB)."""
    assert _refused(side, _bomb(width, height)) == img.TOO_MANY_PIXELS.format(
        where="image 0", width=width, height=height, pixels=width * height, limit=40_000)


async def test_image_count_is_checked_before_decoding(side: ImageSide) -> None:
    with pytest.raises(InvalidRequest, match="has 3 images; max_images_per_request is 2"):
        await prepare_images(side, [_blob(b"x")] * 3, LIMITS, "messages")


def test_settings_carry_the_limits() -> None:
    assert image_limits(IngressSettings()) == ImageLimits(8, 16_777_216, False, 4 * 2**20, 30.0)
    with pytest.raises(ValueError, match="max_image_pixels"):
        IngressSettings(max_image_pixels=0)


def test_data_urls() -> None:
    data = _encoded(random_image(10, 10, seed=5))
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert from_data_url(url, "w", "messages").data == data
    assert from_image_data(base64.b64encode(data).decode(), "w", "image_data").data == data
    assert from_image_data(url, "w", "image_data").data == data


@pytest.mark.parametrize("value", ["file:///etc/passwd" + "x" * 10_000, "/etc/passwd", "data:text/plain;base64,AAAA",
                                   "data:image/png,rawbytes", "ftp://host/cat.png"])
def test_non_image_sources_are_refused_quoting_a_prefix(value: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        (from_image_data if value.startswith(("file:", "/")) else from_data_url)(value, "image 0", "messages")
    assert "data:image/...;base64," in err.value.message and len(err.value.message) < 300


async def test_a_remote_url_is_refused_unless_allowed(side: ImageSide) -> None:
    url = "https://example.com/cat.png?" + "x" * 10_000
    blob = from_data_url(url, "messages[0] image 0", "messages")
    with pytest.raises(InvalidRequest) as err:
        await prepare_images(side, [blob], LIMITS, "messages")
    assert err.value.message == img.NOT_DATA_URL.format(where="messages[0] image 0", value=img.quote(url))


@pytest.fixture
def image_server() -> Iterator[str]:
    """A real HTTP server on this machine serving /cat.png (a PNG), /big (more bytes than the limit), /gone (404)."""
    png = _encoded(random_image(84, 56, seed=9))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = {"/cat.png": png, "/big": b"\0" * 300_000}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


async def test_allowed_urls_are_fetched_within_the_limits(side: ImageSide, image_server: str) -> None:
    allowed = ImageLimits(2, 200 * 200, allow_urls=True, max_bytes=100_000, timeout_s=10)
    (got,) = await prepare_images(side, [from_image_data(f"{image_server}/cat.png", "w", "image_data")], allowed,
                                  "image_data")
    assert got.digest == image_input("qwen2_5_vl", random_image(84, 56, seed=9)).digest
    with pytest.raises(InvalidRequest, match=r"is over max_request_bytes \(100000 bytes\)"):
        await prepare_images(side, [from_image_data(f"{image_server}/big", "w", "image_data")], allowed, "image_data")
    with pytest.raises(InvalidRequest, match=r"could not be fetched .* \(HTTP 404\)"):
        await prepare_images(side, [from_image_data(f"{image_server}/gone", "w", "image_data")], allowed, "image_data")


def test_bad_base64_quotes_a_prefix() -> None:
    with pytest.raises(InvalidRequest) as err:
        from_image_data("!" * 4_000_000, "image_data image 0", "image_data")
    assert err.value.message == img.BAD_BASE64.format(where="image_data image 0", value="!" * img.QUOTE_CHARS)


def test_sglang_refusals_quote_a_prefix() -> None:
    broken = sg.unsupported_field({"video_data": "A" * 4_000_000})
    assert broken is not None and len(broken.message) < 300 and "A" * 31 + "..." in broken.message


def test_expansion_counts_positions_in_the_expanded_prompt(side: ImageSide) -> None:
    (image,) = side.prepare([_blob(_encoded(random_image(84, 56, seed=6)))], LIMITS)
    ids = [1, 5, IMAGE_TOKEN, 6, 2]
    want = expand_placeholders(ids, [ImageInput.from_carrier(image)], IMAGE_TOKEN)
    assert expanded(ids, [image], INFO, "m") == want == [1, 5] + [IMAGE_TOKEN] * image.num_tokens + [6, 2]
    # Already expanded (slime, verl): unchanged.
    assert expanded(want, [image], INFO, "m") == want
    with pytest.raises(InvalidRequest) as err:
        expanded(ids + ids, [image], INFO, "image_data")
    assert err.value.message == img.PLACEHOLDERS.format(runs=2, token_id=IMAGE_TOKEN, images=1)
    with pytest.raises(InvalidRequest, match="has 1 image placeholder runs .* for 0 images"):
        expanded(ids, [], INFO, "input_ids")
    assert expanded(ids, [], ModelInfo("text", 100, 64, "raw_logprobs"), "input_ids") == ids  # a text model


@pytest.mark.parametrize("token_id", [0, 99])  # the lowest id (falsy) and the vocabulary's last row
def test_placeholder_ids_are_compared_never_ranged(side: ImageSide, token_id: int) -> None:
    """Wherever the image token id sits in the vocabulary, the ingress finds and expands its runs by equality, and
    vLLM's token route reports each image's run (return_token_ids: its mm_placeholders)."""
    from ingress.vllm.parse import parse as vllm_parse
    from ingress.vllm.render import mm_placeholders
    from ingress.vllm.schemas import TokenGenerateBody

    (image,) = side.prepare([_blob(_encoded(random_image(84, 56, seed=6)))], LIMITS)
    info = ModelInfo("vl", 100, 64, "raw_logprobs", image_token_id=token_id, vision_start_token_id=5,
                     vision_end_token_id=6)
    ids = [3, 5, token_id, 6, 2]
    want = [3, 5] + [token_id] * image.num_tokens + [6, 2]
    assert expanded(ids, [image], info, "m") == want
    body = TokenGenerateBody(token_ids=ids, sampling_params={"max_tokens": 1}, return_token_ids=True)
    tr = vllm_parse(body, info, 20, [image])
    assert tr.request.input_ids == want
    assert mm_placeholders(tr) == {"image": [{"offset": 2, "length": image.num_tokens}]}


def test_image_tokens_over_the_context() -> None:
    broken = img.image_context(70, [60], 1, 64, "messages")
    assert broken is not None and broken.message == img.IMAGE_CONTEXT.format(
        prompt_len=70, images=1, image_tokens=60, max_tokens=1, context_len=64)


def test_chat_parts_become_markers_and_blobs() -> None:
    data = _encoded(random_image(10, 10, seed=7))
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    msg = ChatMessage.model_validate({"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "b"},
        {"type": "text", "text": "c"}]})
    messages, blobs = template_messages([msg])
    assert messages == [{"role": "user", "content": f"a{IMAGE_MARKER}b\nc"}]
    assert [b.data for b in blobs] == [data] and blobs[0].where == "messages[0] image 0"
    with pytest.raises(InvalidRequest, match="`input_audio` part"):
        template_messages([ChatMessage.model_validate({"role": "user", "content": [{"type": "input_audio"}]})])


def test_a_folder_without_a_processor_fails_at_load(tmp_path: Path) -> None:
    """A folder without an image processor fails at load, not at the first image (the ingress reports it)."""
    with pytest.raises(OSError):
        ImageSide(ModelInfo("vl", 100, 64, "raw_logprobs", model_path=str(tmp_path)))


def test_sglang_image_data_forms() -> None:
    b64 = base64.b64encode(b"img").decode()
    single = image_blobs(parse({"input_ids": [1, 2], "image_data": b64}))
    assert [[b.data for b in item] for item in single] == [[b"img"]]
    listed = image_blobs(parse({"input_ids": [1, 2], "image_data": [b64, b64]}))
    assert [len(item) for item in listed] == [2] and listed[0][1].where == "image_data image 1"
    batch = image_blobs(parse({"input_ids": [[1], [2], [3]], "image_data": [b64, None, [b64, b64]]}))
    assert [len(item) for item in batch] == [1, 0, 2] and batch[2][0].where == "image_data[2] image 0"
    assert image_blobs(parse({"text": "x", "image_data": []})) == [[]]


def test_sglang_image_data_per_prompt_count() -> None:
    b64 = base64.b64encode(b"img").decode()
    with pytest.raises(InvalidRequest, match="image_data list has 1 entries; the batch has 2 prompts"):
        image_blobs(parse({"input_ids": [[1], [2]], "image_data": [b64]}))
    with pytest.raises(InvalidRequest) as err:
        image_blobs(parse({"input_ids": [1], "image_data": [[b64]]}))
    assert err.value.message == sg.IMAGE_DATA_SHAPE


async def test_a_text_model_refuses_images_in_every_dialect() -> None:
    """Through the real routes (a fake worker that serves a text model): a 400 naming the count, no worker call."""
    from tests.helpers.openai_fakes import Backend, call

    url = "data:image/png;base64," + base64.b64encode(_encoded(random_image(10, 10, seed=8))).decode()
    backend = Backend()
    r = await call(backend, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}]})
    assert r.status_code == 400 and r.json()["error"]["message"] == img.NO_IMAGES_HERE.format(n=1)
    r = await call(backend, "POST", "/generate", {"input_ids": [1, 2], "image_data": [url, url],
                                                  "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and r.json()["message"] == img.NO_IMAGES_HERE.format(n=2)
    assert backend.requests == []
