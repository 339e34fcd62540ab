"""Model families by the `architectures` name of a Hugging Face config. Every family is a LlamaForCausalLM
(a subclass where the layout differs), so the runner has one model type to read, and names it: forward,
compute_logits, target_logits, dtype, hidden_size and the KV shape. docs/design/models.md says what a family provides.

A family's module is imported when a checkpoint names it: the families build on engine/layers/, whose modules
build on this package's linear and rope, so importing every family here would make the two packages import each
other at start."""

from __future__ import annotations

from importlib import import_module

from engine.models.llama import LlamaForCausalLM

# architectures name -> the module under engine/models/ that defines the class of that name.
MODEL_REGISTRY: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MistralForCausalLM": "mistral",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "GptOssForCausalLM": "gpt_oss",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "Qwen3_5ForConditionalGeneration": "qwen3_5_vl",
}


# transformers' GenericForSequenceClassification: the family's decoder (checkpoint names under `model.`) and a
# `score` head; architectures name -> the family's causal-LM name whose decoder it wraps.
CLASSIFIER_SUFFIX = "ForSequenceClassification"
_CLASSIFIER_OF: dict[str, str] = {
    **{arch.replace("ForCausalLM", CLASSIFIER_SUFFIX): arch for arch in MODEL_REGISTRY if arch.endswith("ForCausalLM")},
    "Gemma3TextForSequenceClassification": "Gemma3ForCausalLM",
    # transformers' Qwen3.5 classifier of a text config (Qwen3_5ForSequenceClassification takes the vision one).
    "Qwen3_5TextForSequenceClassification": "Qwen3_5ForCausalLM",
}


def model_class(architectures: list[str] | None) -> type[LlamaForCausalLM]:
    """The family class of a causal LM or of a classifier (the same class: LlamaForCausalLM.classifier says
    which head it builds, from the config's architectures)."""
    for arch in architectures or []:
        arch = _CLASSIFIER_OF.get(arch, arch)
        if arch in MODEL_REGISTRY:
            cls: type[LlamaForCausalLM] = getattr(import_module(f"engine.models.{MODEL_REGISTRY[arch]}"), arch)
            return cls
    raise ValueError(f"unsupported model architecture {architectures}; supported: {sorted(MODEL_REGISTRY)} "
                     f"and their classifiers {sorted(_CLASSIFIER_OF)}")
