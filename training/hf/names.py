"""Hugging Face BLOOM's parameter names for ours, both ways: the export writes them
(training/hf/to_hf.py), ``train.init_from`` reads them (training/hf/from_hf.py).

HF Bloom is the same architecture with other names (``transformer.h.3.self_attention.
query_key_value`` for ``blocks.3.attn.qkv``); its fused qkv is laid out per head ([heads, 3,
head_dim]) as ours, so tensors map one to one, unchanged. Files saved from ``BloomModel`` (the
published BLOOM checkpoints) name them without the ``transformer.`` prefix.
"""

from __future__ import annotations

_BLOCK = {
    "ln1": "input_layernorm",
    "attn.qkv": "self_attention.query_key_value",
    "attn.dense": "self_attention.dense",
    "ln2": "post_attention_layernorm",
    "mlp.fc1": "mlp.dense_h_to_4h",
    "mlp.fc2": "mlp.dense_4h_to_h",
}
_TOP = {"embedding.word_embeddings": "word_embeddings", "embed_ln": "word_embeddings_layernorm", "final_ln": "ln_f"}
_FROM_BLOCK = {v: k for k, v in _BLOCK.items()}
_FROM_TOP = {v: k for k, v in _TOP.items()}
PREFIX = "transformer."
TIED_HEAD = "lm_head.weight"
"""HF's output projection: BLOOM ties it to the word embeddings."""


def hf_name(name: str) -> str:
    """A Bloom parameter name as HF ``BloomForCausalLM`` names it."""
    module, leaf = name.rsplit(".", 1)
    if module in _TOP:
        return f"{PREFIX}{_TOP[module]}.{leaf}"
    _, i, rest = module.split(".", 2)  # blocks.<i>.<rest>
    return f"{PREFIX}h.{i}.{_BLOCK[rest]}.{leaf}"


def bloom_name(hf: str) -> str | None:
    """Our name of an HF Bloom parameter (with or without the ``transformer.`` prefix); None for
    a name that is not one of the model's parameters."""
    hf = hf.removeprefix(PREFIX)
    module, _, leaf = hf.rpartition(".")
    if module in _FROM_TOP:
        return f"{_FROM_TOP[module]}.{leaf}"
    parts = module.split(".", 2)
    if len(parts) == 3 and parts[0] == "h" and parts[1].isdigit() and parts[2] in _FROM_BLOCK:
        return f"blocks.{parts[1]}.{_FROM_BLOCK[parts[2]]}.{leaf}"
    return None
