"""Bodies and answers of POST /classify (vLLM's and SGLang's shapes) and POST /pooling (vLLM's), as each project
declares them (vLLM: its entrypoints/pooling classify and pooling protocols; SGLang: EmbeddingReqInput)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# A field of neither project's shape is a 422 naming it, never ignored.
CLASSIFY_BODY = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

Input = str | list[str] | list[int] | list[list[int]]


class ClassifyBody(BaseModel):
    """POST /classify: vLLM's body (`input`, `model`, `use_activation`, `add_special_tokens`) or SGLang's
    (`text` or `input_ids`, `rid`); which one is decided by the fields present."""

    model_config = CLASSIFY_BODY

    model: str | None = Field(None, description="vLLM: must be the served model's name when given.")
    input: Input | None = Field(None, description="vLLM: a text, texts, token ids or lists of token ids.")
    use_activation: bool | None = Field(None, description="vLLM: `probs` through the model's activation "
                                        "(softmax; sigmoid for one label or multi_label_classification; none "
                                        "for regression); false: the raw scores. Default true.")
    add_special_tokens: bool = Field(True, description="vLLM: texts are tokenized with the tokenizer's special "
                                     "tokens (BOS), as vLLM does.")
    user: str | None = Field(None, description="vLLM: the end user's id (recorded nowhere).")
    text: str | list[str] | None = Field(None, description="SGLang: one text or a batch of texts.")
    input_ids: list[int] | list[list[int]] | None = Field(None, description="SGLang: one prompt's ids or a batch.")
    rid: str | list[str] | None = Field(None, description="SGLang: the request id(s), one per prompt.")


class PoolingBody(BaseModel):
    """POST /pooling (vLLM's PoolingCompletionRequest, for a classifier's task)."""

    model_config = CLASSIFY_BODY

    model: str | None = Field(None, description="Must be the served model's name when given.")
    input: Input = Field(description="A text, texts, token ids or lists of token ids.")
    task: str | None = Field(None, description="'classify' (the only task a classifier pools for) or null.")
    use_activation: bool | None = Field(None, description="As /classify's; default true.")
    add_special_tokens: bool = Field(True, description="Texts tokenized with the tokenizer's special tokens.")
    encoding_format: str = Field("float", description="'float' only.")
    user: str | None = Field(None, description="The end user's id (recorded nowhere).")


class ClassifyUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: dict | None = None


class ClassificationData(BaseModel):
    index: int
    label: str | None = Field(description="id2label of the most probable class (null when the config names none).")
    probs: list[float] = Field(description="Per label: the activated scores (raw ones with use_activation false).")
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: ClassifyUsage


class PoolingData(BaseModel):
    index: int
    object: str = "pooling"
    data: list[float]


class PoolingResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: ClassifyUsage


class SGLangClassifyAnswer(BaseModel):
    """SGLang's answer per prompt (a list of them for a batch): `embedding` holds the head's raw scores (a
    reward model's reward), as SGLang's /classify returns them."""

    embedding: list[float]
    meta_info: dict
