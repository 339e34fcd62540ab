"""Tiny random Llama / Qwen2 checkpoints built locally with transformers (no hub), with a small BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Scoring text means computing the log-probability of every token after a boundary.",
    "Paged KV caches hold keys and values in fixed-size blocks; 0123456789 digits too.",
    "Hello world! Ray Serve routes requests to workers, each running one engine.",
]
VOCAB = 320


def _tokenizer(folder: Path, special: tuple[str, ...] = (), size: int = VOCAB) -> None:
    """The BPE tokenizer of `size` ids; `special` tokens (a vision-language model's image tokens) take the top ids, in
    order, as added special tokens, so a text holding one tokenizes to its id. A base vocabulary larger than the
    corpus trains to is filled with tokens no merge produces (`<unused_i>`: ids a prompt may hold, as a real
    tokenizer's rare tokens), so the specials sit where a real checkpoint's do: after the tokenizer's base size."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    base = size - len(special) if special else size - 2  # (the trainer's size counts <eos> and <pad>)
    trainer = trainers.BpeTrainer(vocab_size=min(base, VOCAB), special_tokens=["<eos>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if base > VOCAB:
        model = json.loads(tok.to_str())["model"]
        vocab: dict[str, int] = dict(model["vocab"])
        vocab.update({f"<unused_{i}>": i for i in range(len(vocab), base)})
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        trained = tok
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
        tok.pre_tokenizer, tok.decoder = trained.pre_tokenizer, trained.decoder
        tok.add_special_tokens(["<eos>", "<pad>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    if special:
        fast.add_special_tokens({"additional_special_tokens": list(special)})
        assert fast.convert_tokens_to_ids(list(special)) == list(range(size - len(special), size)), "vocab short"
    fast.save_pretrained(folder)


def build_tiny_model(folder: Path, family: str = "llama", tie: bool = False, rope_scaling: dict | None = None,
                     seed: int = 0) -> Path:
    """Writes config.json + model.safetensors + tokenizer into folder; returns folder."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie, eos_token_id=0, bos_token_id=None,
                  pad_token_id=1)
    torch.manual_seed(seed)
    if family == "llama":
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        if rope_scaling:
            rope = {**rope_scaling, "rope_theta": 500000.0}
        model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_parameters={"rope_type": "default",
                                                                       "rope_theta": 1000000.0}))
    else:
        raise ValueError(family)
    # Random init is small; widen the weights so logits are spread and tests are sensitive.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return folder
