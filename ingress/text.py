"""The text side of the ingress: the served tokenizer and its chat template, loaded once per ingress replica from
the model folder the workers serve (ModelInfo.model_path), so that text never costs a worker call.

Tokenizing prompts and chat messages, echoing prompts given as ids, the token texts of logprob entries and
/tokenize, /detokenize, /tokenizer_info all run here, in a thread (a long text takes seconds and the event loop must
keep streaming other answers). The workers take ids and return ids and logprobs: the generated text is decoded here,
incrementally, and stop strings are matched here (ingress/output/), as vLLM's API server does; a match ends
the worker's request through the abort path (the worker call is closed).

The tokenizer is transformers' AutoTokenizer over the folder's tokenizer.json (the fast Rust tokenizer), exactly
what the engine loads (engine/loading/loader.py): the ids and texts are the same on both sides. Imported lazily, at
the first request that needs text: importing the ingress loads neither transformers nor torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from protocol import ChatPrompt, ModelInfo, TokenizerInfo
from rulebook import rules

# What a chat message's image part becomes in the text the template renders; the rendered text is split there and
# the model's image ids (vision start, placeholder, vision end) put between the pieces' ids, so no tokenizer needs to
# know the model's image tokens as text. A client's own text holding it is one more image run: a 400 (the counts).
IMAGE_MARKER = "<|rayscore:image|>"


class TextSide:
    """One ingress replica's tokenizer. Every method is synchronous: call it through asyncio.to_thread."""

    def __init__(self, info: ModelInfo) -> None:
        from transformers import AutoTokenizer

        if not info.model_path:
            raise RuntimeError("The worker reported no model folder: the ingress cannot load the tokenizer.")
        self.info = info
        self.tokenizer: Any = AutoTokenizer.from_pretrained(info.model_path)
        # Each id's text decoded alone, as `token_texts` made it: a logprob answer names the same few thousand ids
        # again and again, and decoding them one at a time is most of its rendering. At most the vocabulary.
        self._token_texts: dict[int, str] = {}

    def untokenizable(self, text: str, what: str = "prompt") -> rules.Violation | None:
        return rules.untokenizable(text, self.info.max_model_len, self.info.prompt_chars_per_token, what)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`text`'s ids; by default as a text prompt is tokenized (no special tokens added). A text over
        max_prompt_chars_per_token raises ValueError with the rule's message (the routes check first)."""
        broken = self.untokenizable(text)
        if broken is not None:
            raise ValueError(broken.message)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        for text in texts:
            broken = self.untokenizable(text)
            if broken is not None:
                raise ValueError(broken.message)
        return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]

    def decode(self, ids: list[int]) -> str:
        """The text of in-vocabulary `ids`, special tokens included."""
        text: str = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text

    def decode_many(self, prompts: list[list[int]]) -> list[str]:
        texts: list[str] = self.tokenizer.batch_decode(prompts, skip_special_tokens=False)
        return texts

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each id decoded alone, special tokens included: OpenAI's per-token strings (`logprobs.tokens`). The ids
        decoded before come from the cache; the others are decoded (in the caller's thread) and kept."""
        cache = self._token_texts
        missing = [i for i in dict.fromkeys(ids) if i not in cache]
        if missing:
            texts = self.tokenizer.batch_decode([[i] for i in missing], skip_special_tokens=False)
            cache.update(zip(missing, texts, strict=True))
        return [cache[i] for i in ids]

    def cached_token_texts(self, ids: list[int]) -> list[str] | None:
        """`token_texts(ids)` when every id's text was decoded before (no tokenizer work: no thread needed), else
        None."""
        cache = self._token_texts
        try:
            return [cache[i] for i in ids]
        except KeyError:
            return None

    def chat_prompt(self, messages: list[dict[str, Any]], image_ids: tuple[int, ...] = ()) -> ChatPrompt:
        """`messages` ({role, content} with text content, and name / tool_calls / tool_call_id) under the
        tokenizer's chat template, ending with the assistant turn's opening (add_generation_prompt), tokenized as a
        text prompt is: the template writes the special tokens itself."""
        from jinja2.exceptions import TemplateError

        if not getattr(self.tokenizer, "chat_template", None):
            return ChatPrompt([], error="The served model's tokenizer has no chat template.")
        # The client's strings side by side: their length is what the template renders, and a lone surrogate stays
        # one wherever it sits (Python never pairs two surrogates of separate strings).
        client_text = "".join(s for m in messages for k, v in m.items() if k != "role" for s in _strings(v))
        broken = self.untokenizable(client_text, "message")
        if broken is not None:
            return ChatPrompt([], error=broken.message)
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except TemplateError as exc:  # the template's own raise_exception (roles it does not accept, ...)
            return ChatPrompt([], error=f"The chat template rejected the messages: {exc}")
        if not image_ids:
            return ChatPrompt(self.tokenizer.encode(text, add_special_tokens=False))
        ids: list[int] = []
        for i, piece in enumerate(text.split(IMAGE_MARKER)):
            ids += ([*image_ids] if i else []) + self.tokenizer.encode(piece, add_special_tokens=False)
        return ChatPrompt(ids)

    def tokenizer_info(self) -> TokenizerInfo:
        tok = self.tokenizer

        def text(name: str) -> str | None:
            value = getattr(tok, name, None)
            return value if isinstance(value, str) else None

        return TokenizerInfo(
            model_name=self.info.model_name, tokenizer_class=type(tok).__name__,
            vocab_size=self.info.vocab_size, max_model_len=self.info.max_model_len,
            eos_token=text("eos_token"), eos_token_id=tok.eos_token_id, bos_token=text("bos_token"),
            bos_token_id=tok.bos_token_id, pad_token=text("pad_token"), pad_token_id=tok.pad_token_id,
            chat_template=text("chat_template"))


def _strings(value: object) -> Iterator[str]:
    """Every string inside a JSON value (the messages' contents, names, tool calls' arguments, without the roles):
    what a template may write of the client's text."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
