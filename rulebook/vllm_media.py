"""vLLM 0.32's media inputs on the routes that take them, and the messages of those this server refuses.

vLLM's chat content parts (vllm/renderers/chat_utils.py, MM_PARSER_MAP) carry an image as `image_url` (`{"url": ...}`
or the URL itself, the form vLLM takes without a `type`) or `input_image` (the Responses API's part, `image_url` the
URL), each with an optional `uuid`; its token-in route POST /inference/v1/generate
(vllm/entrypoints/scale_out/token_in_token_out/) takes `content_parts` (`{"type": "image_url", "url": ..., "uuid":
...}`, resolved by the server beside token_ids that hold the placeholders) or `features` (what vLLM's /render wrote:
its processor's tensors, msgpack-serialized). /v1/completions takes no images in vLLM.

Taken here: the image URL forms (data: URLs; http(s) with allow_image_urls), decoded like every dialect's images. A
`uuid` beside an image is accepted: vLLM keys its media cache by it, this server by the image's content, which a
correct client's uuid names anyway. Refused, naming the part or field: a uuid with no image (vLLM's cache by uuid),
`image_embeds` (the tower's output in place of the image), `image_pil` (a Python object, never in a JSON body), audio,
video and prompt embeddings, and `features`.
"""

from __future__ import annotations

from rulebook.rules import Violation

# The parts that carry an image, by vLLM's type names.
IMAGE_PART_TYPES = ("image_url", "input_image")
# vLLM's other media part types: refused by name (the served models take images only).
OTHER_MEDIA_TYPES = ("audio_url", "input_audio", "video_url", "audio_embeds", "video_embeds", "prompt_embeds")
# A chat part's media payload key -> the part type vLLM reads it as (an untyped part is typed by its key).
PAYLOAD_KINDS = {"image_embeds": "image_embeds", "image_pil": "image_pil", "audio_url": "audio_url",
                 "input_audio": "input_audio", "video_url": "video_url", "audio_embeds": "audio_embeds",
                 "video_embeds": "video_embeds", "data": "prompt_embeds"}
# The keys a token-in route content part may have (vLLM's serving module reads these).
CONTENT_PART_KEYS = ("type", "url", "uuid")

IMAGE_EMBEDS = ("The {where} is an `image_embeds` part: this server runs the vision tower itself and takes the "
                "image, not its embeddings. Send it as an `image_url` data: URL (docs/multimodal.md).")
IMAGE_PIL = ("The {where} is an `image_pil` part, a PIL object that only vLLM's offline LLM.chat can hold, never a "
             "JSON body. Send the image as an `image_url` data: URL (docs/multimodal.md).")
OTHER_MEDIA = ("The {where} is a `{kind}` part: this server takes images only (`image_url`, `input_image`; "
               "docs/multimodal.md).")
UUID_ONLY = ("The {where} has a uuid and no image: this server keeps no media cache by uuid (vLLM's does). Send the "
             "image itself; its content keys the prefix cache (docs/multimodal.md).")
NO_TYPE = "The {where} has no `type` and no `image_url`: vLLM's 'Missing 'type' field in multimodal part.'"
PART_SHAPE = ("The {where} must be an object {{\"type\": \"image_url\", \"url\": \"data:image/...\"}} (with an "
              "optional uuid); got a {got}.")
PART_KEY = "The {where} has the key `{key}`: a content part here has only type, url and uuid."
STRAY_PAYLOAD = "The {where} is a `{kind}` part with a `{key}`: one part carries one thing."
PART_TYPE = ("The {where} has type {kind!r}: vLLM's /inference/v1/generate resolves `image_url` (and audio_url, "
             "video_url); this server takes `image_url` only (docs/vllm.md).")


def media_part_violation(kind: str, where: str, param: str) -> Violation | None:
    """A chat content part of vLLM's media types other than an image's: its 400; None for any other type."""
    if kind == "image_embeds":
        return Violation(IMAGE_EMBEDS.format(where=where), param)
    if kind == "image_pil":
        return Violation(IMAGE_PIL.format(where=where), param)
    if kind in OTHER_MEDIA_TYPES:
        return Violation(OTHER_MEDIA.format(where=where, kind=kind), param)
    return None
