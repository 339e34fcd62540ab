"""What the ingress needs from the workers: the routes see only `Backend`, so unit tests inject a fake and run
without Ray; the one real implementation is HandleBackend (ingress/transport/), over the worker deployment's handle.

Three sides, each its own class there and each fakeable: the requests' worker calls (WorkerSide), the text side the
parses and renderers call directly (TextSide), and the admin side (AdminSide).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from ingress.images import ImageBlob, ImageLimits
from protocol import (
    ChatPrompt,
    GenerateRequest,
    ImageData,
    ModelInfo,
    RequestOutput,
    TokenizerInfo,
    WeightUpdate,
    WeightUpdateResult,
)
from protocol.control import GenerationControl


class WorkerSide(Protocol):
    """The requests' calls (ingress/transport/worker_client.py)."""

    async def model_info(self) -> ModelInfo:
        """The served model's limits; raises when no worker can answer."""
        ...

    def stream(self, req: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        """An async generator of the request's deltas, ending after the chunk with finished=True. Each delta's text
        is the ingress's, decoded from its ids, and the answer ends at the first stop string (ingress/output/).

        Closing it (aclose) or cancelling the task that awaits it before the end must abort the
        request in the worker, so that a client that went away frees the engine's memory.
        A worker that died or vanished raises WorkerLost (the lifecycle may run the request again); a full
        queue raises Overloaded. So does every other method below.
        """
        ...

    def streams(self, reqs: list[GenerateRequest]) -> list[AsyncGenerator[RequestOutput, None]]:
        """One stream per request, as `stream`'s, for the requests of one HTTP request (one admitted unit), read from
        one worker call where it can: closing any of them before its end may abort them all (a batch is read and
        closed as a whole)."""
        ...

    async def answers(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        """Each request's whole answer (its deltas merged), in order, from one call: what a non-streamed answer
        needs (a request with stop strings is read as its own stream, so the ingress can end it at a match). The
        answers are as the worker ended them (an `error` finish included; the caller checks).
        Cancelling the awaiting task aborts every request in the worker; errors are translated as in `stream`.
        """
        ...

    async def ready(self) -> bool:
        """True when at least one worker answers; never raises."""
        ...

    async def paused(self) -> str | None:
        """The pause mode a worker reports (a pause holds every replica), None while generating or when no worker
        answers; never raises."""
        ...


class TextSide(Protocol):
    """The served tokenizer, chat template and image processor (ingress/transport/text_client.py: the ingress's own,
    loaded from the model folder; no worker call). Each raises when no worker has told the model yet."""

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`text`'s ids; by default exactly as a text prompt of `generate` is tokenized."""
        ...

    async def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        """`tokenize` of each of `texts` (no special tokens), from one call."""
        ...

    async def detokenize(self, ids: list[int]) -> str:
        """The text of in-vocabulary `ids`, special tokens included."""
        ...

    async def detokenize_many(self, prompts: list[list[int]]) -> list[str]:
        """`detokenize` of each of `prompts`, from one call."""
        ...

    async def token_texts(self, ids: list[int]) -> list[str]:
        """Each in-vocabulary id decoded alone."""
        ...

    async def apply_chat_template(self, messages: list[dict[str, Any]],
                                  image_ids: tuple[int, ...] = ()) -> ChatPrompt:
        """The ids of chat `messages` under the tokenizer's chat template, with the assistant turn opened; each
        IMAGE_MARKER in the rendered text becomes `image_ids` (vision start, one placeholder, vision end)."""
        ...

    async def prepare_images(self, blobs: list[ImageBlob], limits: ImageLimits, param: str) -> list[ImageData]:
        """The images decoded and preprocessed by this replica's image processor, in a thread; InvalidRequest names
        the first broken limit."""
        ...

    async def tokenizer_info(self) -> TokenizerInfo:
        ...


class AdminSide(Protocol):
    """Weights (ingress/weights/routes.py): every worker replica, through the deployment's weight registry; LoRA
    adapters (ingress/adapters/): the deployment's registry, name -> PEFT folder; the generation controls
    (ingress/transport/admin_client.py)."""

    async def update_weights(self, req: WeightUpdate) -> WeightUpdateResult:
        """Every replica loads req.model_path, or none does (success False, the reason in message)."""
        ...

    async def weight_version(self) -> str:
        ...

    async def adapters(self) -> dict[str, str]:
        ...

    async def load_adapter(self, name: str, path: str) -> str | None:
        """Check the adapter on a worker, then register it; the refusal's message, or None when loaded."""
        ...

    async def unload_adapter(self, name: str) -> bool:
        """False when no adapter has the name."""
        ...

    async def control(self, op: GenerationControl) -> WeightUpdateResult:
        """A control operation (protocol/control.py: Pause, Resume, Abort, FlushCache) on every worker replica,
        through the same registry. num_paused_requests: the requests touched."""
        ...


class Backend(WorkerSide, TextSide, AdminSide, Protocol):
    """Everything the routes call."""
