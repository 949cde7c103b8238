"""BLOOM as readable single-device PyTorch.

The architecture of BLOOM (BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual
Language Model", 2022, §3.2) and of Hugging Face's ``BloomForCausalLM``:

    word embedding → embed_ln → N × [x + attn(ln1(x)); x + mlp(ln2(x))] → final_ln → x @ Eᵀ

* ALiBi instead of position embeddings (§3.2.2): each head adds −slope·(i − j) to the score of
  query i on key j, so attention depends only on relative distance.
* A LayerNorm right after the embedding (§3.2.2, "embedding LayerNorm"): it made the 104B
  pilot runs stable.
* The output projection is the transposed word embedding (tied, no separate LM head).
* GeLU with the tanh approximation (HF ``bloom_gelu_forward``), biases everywhere, no dropout.

Packed samples (``data_prep/FORMAT.md``): one row holds several documents; attention never
crosses a document boundary. ``segment_ids`` [B, T] tells each position its document (1, 2, ...)
and marks padding with 0; :func:`attention_bias` turns it into a mask with ALiBi folded in.

Made to be parallelised from outside, not from in here:

* Tensor parallelism swaps ``nn.Linear``/``nn.Embedding`` for megatron-core's
  Column/RowParallelLinear and VocabParallelEmbedding. Attention therefore reads its number of
  heads off ``attn.qkv.weight`` and its slopes off the ``attn.alibi_slopes`` buffer, and the
  fused qkv output is laid out per head ([heads, 3, head_dim], as HF Bloom), so contiguous row
  chunks of the qkv weight are whole heads.
* Pipeline parallelism cuts the model into :class:`EmbeddingStage`, :class:`Block` × N and
  :class:`HeadStage`; each builds and initialises itself from the config alone, and the head
  takes the word-embedding weight as an argument so the two ends can share it across stages.
* Activation checkpointing wraps the blocks from outside.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from training.config import ModelConfig


# ----------------------------------------------------------------------------- ALiBi and masks

def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes [num_heads] (float32), computed as HF ``build_alibi_tensor`` does.

    For n a power of two the slopes are the geometric sequence 2^(−8i/n), i = 1..n (Press et al.,
    "Train Short, Test Long", §3). Otherwise take the slopes of the closest smaller power of two c
    and add every other slope of the 2c sequence (2^(−8i/2c) for odd i) for the remaining heads.
    """
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)  # = 2^(−8/c)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        remaining = min(closest, num_heads - closest)
        extra = torch.pow(extra_base, torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32))
        slopes = torch.cat([slopes, extra])
    return slopes


def segment_ids_from_offsets(doc_offsets: list[list[int]], lengths: list[int], T: int) -> torch.Tensor:
    """Document index of every position of a padded batch: LongTensor [B, T].

    ``doc_offsets[b]`` and ``lengths[b]`` are a shard row's columns (first offset 0, strictly
    increasing, all below the length, length ≤ T). Positions of the k-th document get k (1-based);
    padding positions (≥ length) get 0.
    """
    out = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, (offsets, n) in enumerate(zip(doc_offsets, lengths)):
        if not (0 < n <= T) or not offsets or offsets[0] != 0 or offsets[-1] >= n \
                or any(a >= c for a, c in zip(offsets, offsets[1:])):
            raise ValueError(f"sample {b}: bad doc_offsets {offsets} for length {n} (T={T})")
        # number of offsets ≤ position = 1-based index of the document holding it
        out[b, :n] = torch.bucketize(torch.arange(n), torch.tensor(offsets), right=True)
    return out


def attention_bias(segment_ids: torch.Tensor, slopes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention bias [B, h, T, T] for ``scaled_dot_product_attention``.

    bias[b, n, i, j] = −slopes[n]·(i − j) where key j ≤ query i and both lie in the same
    document (same nonzero segment id); the dtype's most negative value elsewhere. Not −inf:
    a padding query (segment 0) keeps its own position so that no softmax row is all −inf (NaN).
    """
    T = segment_ids.shape[1]
    pos = torch.arange(T, device=segment_ids.device)
    seg_q, seg_k = segment_ids[:, :, None], segment_ids[:, None, :]
    allowed = (pos[None, :, None] >= pos[None, None, :]) & (seg_q == seg_k) & (seg_q != 0)
    allowed |= torch.eye(T, dtype=torch.bool, device=segment_ids.device)
    alibi = slopes.float()[:, None, None] * (pos[None, :] - pos[:, None])  # [h, T, T]: −slope·(i − j)
    bias = torch.where(allowed[:, None], alibi[None], torch.finfo(dtype).min)
    return bias.to(dtype)


# ----------------------------------------------------------------------------- modules

def _init_weights(module: nn.Module, std: float) -> None:
    """BLOOM/HF init: normal(0, std) for linear and embedding weights, zero biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class EmbeddingStage(nn.Module):
    """input_ids [B, T] long → hidden [B, T, H]: word embedding, then its LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # Padded so that the table splits evenly over TP ranks (Megatron's rule, config.py).
        self.word_embeddings = nn.Embedding(cfg.padded_vocab(tp=1), cfg.hidden_size)
        self.embed_ln = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        _init_weights(self, cfg.init_std)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_ln(self.word_embeddings(input_ids))


class Attention(nn.Module):
    """Causal self-attention with ALiBi, kept inside each document.

    The number of heads is whatever ``qkv`` produces (``qkv.weight.shape[0] // (3·head_dim)``)
    and ``alibi_slopes`` holds one slope per such head, so a TP rank holding a slice of the qkv
    rows and of the slopes computes its heads unchanged.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(h, 3 * h)  # output rows: [heads, 3 (q, k, v), head_dim]
        self.dense = nn.Linear(h, h)
        # A constant of the architecture, not a weight: rebuilt on load, left out of checkpoints.
        self.register_buffer("alibi_slopes", alibi_slopes(cfg.num_heads), persistent=False)

    @property
    def num_heads(self) -> int:
        return self.qkv.weight.shape[0] // (3 * self.head_dim)

    def forward(self, x: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        """x [B, T, H], segment_ids [B, T] → [B, T, H]."""
        B, T, _ = x.shape
        # HF Bloom's layout: view the fused output as [B, T, heads, 3, head_dim].
        qkv = self.qkv(x).view(B, T, self.num_heads, 3, self.head_dim)
        q, k, v = (qkv[..., i, :].transpose(1, 2) for i in range(3))  # each [B, heads, T, head_dim]
        bias = attention_bias(segment_ids, self.alibi_slopes, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # scale 1/sqrt(head_dim)
        return self.dense(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """H → ffn_mult·H → GeLU (tanh approximation, as BLOOM) → H."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.ffn_mult * cfg.hidden_size)
        self.fc2 = nn.Linear(cfg.ffn_mult * cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN transformer block: hidden [B, T, H], segment_ids [B, T] → hidden [B, T, H]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.mlp = MLP(cfg)
        _init_weights(self, cfg.init_std)

    def forward(self, hidden: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.ln1(hidden), segment_ids)
        return hidden + self.mlp(self.ln2(hidden))


class HeadStage(nn.Module):
    """hidden [B, T, H] → logits [B, T, V] = final_ln(hidden) @ word_embedding_weightᵀ.

    The weight is an argument, not a parameter: it is the embedding's, shared (tied) with the
    first stage, wherever that lives. V is the padded vocabulary.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.final_ln = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.vocab_size = cfg.vocab_size
        _init_weights(self, cfg.init_std)

    def forward(self, hidden: torch.Tensor, word_embedding_weight: torch.Tensor) -> torch.Tensor:
        return mask_padded_vocab(F.linear(self.final_ln(hidden), word_embedding_weight), self.vocab_size)


PAD_LOGIT = -1e4  # exp(-1e4 - max) is 0 in fp32; finite, so a slice of only padding is no NaN


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int, first_id: int = 0) -> torch.Tensor:
    """Give the padding columns (token ids >= ``vocab_size``; logits' column 0 is id ``first_id``)
    the logit PAD_LOGIT, in place.

    The table is padded only so it splits evenly over TP ranks. Masked, padding rows carry no
    probability and get no gradient, so the model does not depend on how far it is padded and a
    checkpoint re-padded for another TP (training/reshard.py) is the same model. In place on the
    projection's output is safe: the matmul's backward needs its inputs, not its output."""
    start = max(0, vocab_size - first_id)
    if start < logits.shape[-1]:
        logits[..., start:] = PAD_LOGIT
    return logits


class Bloom(nn.Module):
    """The whole model on one device: input_ids [B, T], segment_ids [B, T] → logits [B, T, V]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embedding = EmbeddingStage(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.head = HeadStage(cfg)

    def forward(self, input_ids: torch.Tensor, segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """segment_ids from :func:`segment_ids_from_offsets`; None: each row is one document, unpadded."""
        if segment_ids is None:
            segment_ids = torch.ones_like(input_ids)
        hidden = self.embedding(input_ids)
        for block in self.blocks:
            hidden = block(hidden, segment_ids)
        return self.head(hidden, self.embedding.word_embeddings.weight)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Mean cross-entropy over positions whose label is not ``ignore_index``.

        logits [B, T, V], labels [B, T] (already shifted: labels[t] is the token after t).
        Computed in fp32 whatever the logits' dtype: bf16 log-softmax over 250k entries is too coarse.
        """
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=ignore_index)

    def num_params(self) -> int:
        """Parameters, the tied embedding counted once (bloom-560m: 559,214,592)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token: 6·N + 12·L·H·T.

        The estimate of PaLM (Chowdhery et al. 2022, Appendix B: 6N + 12·L·H·Q·T, with H·Q =
        hidden size here): 2 FLOPs per parameter per token forward and 4 backward, plus the two
        attention matmuls (QKᵀ and attention·V, 2·T·H each forward) per layer. N includes the
        tied embedding because it is also the output projection (2·V·H per token forward). It
        equals Megatron-LM's count (Narayanan et al. 2021, §5.1) without recomputation, up to the
        biases and LayerNorms; recomputation (activation checkpointing) is not counted, as for MFU.
        """
        return 6 * self.num_params() + 12 * self.cfg.num_layers * self.cfg.hidden_size * seq_len
