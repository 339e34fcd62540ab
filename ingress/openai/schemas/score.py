"""The HTTP shapes of `POST /v1/score` (SGLang's ScoringRequest)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ingress.openai.schemas.common import CLOSED_BODY, Usage


class ScoreBody(BaseModel):
    """Request body of `POST /v1/score` (SGLang's ScoringRequest)."""

    model_config = CLOSED_BODY

    model: str | None = Field(None, description="Must be the served model's name when given.")
    query: str | list[int] | None = Field(None, description="Text, or token ids: the same kind as `items`.")
    items: str | list[str] | list[list[int]] | None = Field(
        None, description="One item (text) or a list of them (texts, or token-id lists): one score list each.")
    label_token_ids: list[int] | None = Field(None, description="The tokens whose next-token probability "
                                              "each item gets, in this order.")
    apply_softmax: bool = Field(False, description="Softmax over the label tokens' logits (each item's scores "
                                "sum to 1) instead of their probabilities under the full distribution.")
    item_first: bool = Field(False, description="Score item+query instead of query+item.")
    return_flat_logprobs_b64: bool = Field(False, description="`scores` as one flat base64 array of little-endian "
                                           "float64 with its shape [items, labels] (`scores_val_flat_b64`, "
                                           "`scores_shape`): docs/vllm.md, compact format.")


class ScoreResponse(BaseModel):
    scores: list[list[float]] = Field(description="Per item, in order, one probability per label token.")
    model: str
    usage: Usage = Field(description="prompt_tokens: the query+item tokens of every item.")
    object: str = "scoring"
