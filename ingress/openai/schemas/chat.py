"""The HTTP shapes of `POST /v1/chat/completions`: the request body FastAPI validates, response models for OpenAPI.

OpenAI's chat completions: messages with text content (a string, or a list of text parts), sampling and
stopping as /v1/completions (`SamplingFields`), `logprobs` / `top_logprobs` as OpenAI spells them. Type
errors are 422s; value errors are validation.py's 400s, naming the field in `param`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ingress.openai.schemas.common import STRICT_BODY, SamplingFields, Usage


class ImageURL(BaseModel):
    model_config = STRICT_BODY

    url: str = Field(description="A `data:image/<type>;base64,...` URL; an http(s) URL only with the "
                     "server's allow_image_urls (else 400).")
    detail: str | None = Field(None, description="Accepted and unused: the model's image processor sizes images.")


class ContentPart(BaseModel):
    model_config = STRICT_BODY

    type: str | None = Field(None, description="`text`, or `image_url` / `input_image` for a vision-language model "
                             "(docs/multimodal.md); vLLM's untyped part with an `image_url` is an image part.")
    text: str | None = None
    image_url: ImageURL | str | None = Field(None, description="{\"url\": ...}, or the URL itself (vLLM's form).")
    uuid: str | None = Field(None, description="vLLM's media id: accepted beside an image (its content keys the "
                             "prefix cache); alone, a 400.")
    # vLLM's other media parts' payloads, declared so that such a part is a 400 naming it (rulebook/vllm_media.py)
    # rather than a 422 on an unknown key.
    image_embeds: Any = Field(None, description="vLLM's: not taken (400); send the image.")
    image_pil: Any = Field(None, description="vLLM's offline form: not taken (400).")
    audio_url: Any = Field(None, description="Not taken (400): images only.")
    input_audio: Any = Field(None, description="Not taken (400): images only.")
    video_url: Any = Field(None, description="Not taken (400): images only.")
    audio_embeds: Any = Field(None, description="Not taken (400): images only.")
    video_embeds: Any = Field(None, description="Not taken (400): images only.")
    data: Any = Field(None, description="vLLM's prompt_embeds part: not taken (400).")


class ChatMessage(BaseModel):
    model_config = STRICT_BODY

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(None, description="Text, or a list of text and "
                                                    "image_url parts.")
    # Given to the chat template as they are, as vLLM and transformers do: what a template writes of them is the
    # template's (SmolLM2's writes none of them).
    name: str | None = Field(None, description="The participant's name, given to the chat template.")
    tool_calls: list[dict[str, Any]] | None = Field(None, description="An assistant turn's tool calls, given to "
                                                    "the chat template.")
    tool_call_id: str | None = Field(None, description="The call a tool turn answers, given to the chat template.")


class ChatBody(SamplingFields):
    """Request body of `POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(description="The conversation, rendered by the served tokenizer's chat "
                                        "template with the assistant's turn opened.")
    max_completion_tokens: int | None = Field(None, description="Tokens to generate; null: up to the context "
                                              "length. Takes precedence over `max_tokens`.")
    max_tokens: int | None = Field(None, description="Deprecated by OpenAI for `max_completion_tokens`; same "
                                   "meaning.")
    echo: bool | None = Field(False, description="vLLM's: when the last message is the assistant's, the answer's "
                              "content starts with its text (text parts joined by newlines); `logprobs` still "
                              "cover the generated tokens only (the prompt's rows: `prompt_logprobs`).")
    logprobs: bool | None = Field(False, description="Return each generated token's logprob.")
    top_logprobs: int | None = Field(None, description="With `logprobs`: also the k (0-20) most likely tokens "
                                     "per position.")
    tools: list[Any] | None = Field(None, description="Not supported: only null or [].")
    response_format: dict[str, Any] | None = Field(None, description="Only null or {\"type\": \"text\"}.")


# Response models: documentation only (the route builds its JSON by hand, see ingress/openai/render/chat.py).

class TopLogprob(BaseModel):
    token: str = Field(description="The token decoded alone.")
    logprob: float
    bytes: list[int] = Field(description="The UTF-8 bytes of `token`.")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="The `top_logprobs` most likely tokens, best first.")


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: Literal["stop", "length"]


class ChatResponse(BaseModel):
    """The JSON answer; with `stream`, `chat.completion.chunk` events carry `delta` instead of `message`."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
