"""BLOOM as readable single-device PyTorch: the one model that trains, at every layout.

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

Made to be parallelised from outside (``training/parallel/parallelize.py``), not from in here:

* :meth:`Bloom.layers` is the model as a flat list of layers, each mapping the pair
  ``(hidden, segment_ids)`` to the next pair; the first takes ``(input_ids, segment_ids)``.
  Pipeline parallelism hands these very modules to DeepSpeed as its pipeline layers, and
  :meth:`Bloom.forward` runs the same list, so there is one model whatever the layout.
* Tensor parallelism swaps ``nn.Linear``/``nn.Embedding`` for megatron-core layers in place.
  Attention therefore reads its number of heads off ``attn.qkv.weight`` and its first head off
  ``attn.first_head``; the fused qkv output is laid out per head ([heads, 3, head_dim], as HF
  Bloom), so contiguous row chunks of the qkv weight are whole heads. The embedding's
  ``first_row`` and ``project_input`` are what its vocabulary-parallel form sets.
* Initialisation (:func:`init_weights`) draws every parameter from a generator seeded by the
  seed and the parameter's *name*, so a module initialises the same wherever it lives and a
  TP rank's slice is the slice of the full tensor: the same seed is the same function at any
  layout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from functools import lru_cache
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from training.config import ModelConfig

IGNORE_INDEX = -100
"""Label of positions the loss skips (padding, document ends); ``F.cross_entropy``'s default."""

Activations = tuple[torch.Tensor, torch.Tensor]
"""What flows between layers: (hidden [B, T, H] — input_ids [B, T] before the first —, segment_ids [B, T])."""

NORMS = ("embed_ln", "final_ln", "ln1", "ln2")
"""Names of the LayerNorm modules (weight 1, bias 0 at init)."""


# ----------------------------------------------------------------------------- ALiBi and masks


@lru_cache(maxsize=16)
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


@lru_cache(maxsize=64)
def head_slopes(total_heads: int, first_head: int, num_heads: int, device: torch.device) -> torch.Tensor:
    """The slopes of heads ``first_head`` .. ``first_head + num_heads`` (a TP rank's) on ``device``:
    one tensor per head range, so :func:`attention_bias` knows it again by identity."""
    return alibi_slopes(total_heads)[first_head : first_head + num_heads].to(device)


def segment_ids_from_offsets(doc_offsets: list[list[int]], lengths: list[int], T: int) -> torch.Tensor:
    """Document index of every position of a padded batch: LongTensor [B, T].

    ``doc_offsets[b]`` and ``lengths[b]`` are a shard row's columns (first offset 0, strictly
    increasing, all below the length, length ≤ T). Positions of the k-th document get k (1-based);
    padding positions (≥ length) get 0.
    """
    out = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, (offsets, n) in enumerate(zip(doc_offsets, lengths)):
        if (
            not (0 < n <= T)
            or not offsets
            or offsets[0] != 0
            or offsets[-1] >= n
            or any(a >= c for a, c in zip(offsets, offsets[1:]))
        ):
            raise ValueError(f"sample {b}: bad doc_offsets {offsets} for length {n} (T={T})")
        # number of offsets ≤ position = 1-based index of the document holding it
        out[b, :n] = torch.bucketize(torch.arange(n), torch.tensor(offsets), right=True)
    return out


def attention_bias(
    segment_ids: torch.Tensor, slopes: torch.Tensor, dtype: torch.dtype, key_segment_ids: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Additive attention bias [B, h, Tq, Tk] for ``scaled_dot_product_attention``.

    bias[b, n, i, j] = −slopes[n]·(i − j) where key j ≤ query i and both lie in the same
    document (same nonzero segment id); the dtype's most negative value elsewhere. Not −inf:
    a padding query (segment 0) keeps its own position so that no softmax row is all −inf (NaN).

    ``key_segment_ids`` [B, Tk] (generation with a :class:`KVCache`): the keys are the cached
    positions and then the queries, so query i sits at position Tk − Tq + i; None: the queries
    are the keys (Tq = Tk).
    """
    # Every block of a forward (and its recomputation under activation checkpointing) asks for the
    # same bias: one tensor of segment ids runs through the layers unchanged, and the slopes are
    # one tensor per head range (:func:`head_slopes`). Built once per forward instead of once per
    # layer, bloom-tiny's forward+backward ran 1.2x faster on CPU, and the layers share one saved
    # mask instead of each keeping its own for backward. The memo holds its key tensors, so no id
    # is reused while they are cached; ``_version`` catches an in-place edit of the segment ids.
    if torch.compiler.is_compiling():  # a compiled block builds its own: no global state in its graph
        return _attention_bias(segment_ids, slopes, dtype, key_segment_ids)
    tensors = (segment_ids, key_segment_ids, slopes)  # compared by identity
    versions = (segment_ids._version, None if key_segment_ids is None else key_segment_ids._version)
    values = (*versions, dtype, torch.is_inference_mode_enabled())
    memo = _last_bias
    if memo is not None and all(a is b for a, b in zip(memo[0], tensors)) and memo[1] == values:
        return memo[2]
    bias = _attention_bias(segment_ids, slopes, dtype, key_segment_ids)
    globals()["_last_bias"] = (tensors, values, bias)  # one assignment: a reader in another thread sees a whole memo
    return bias


_last_bias: Optional[tuple[tuple, tuple, torch.Tensor]] = None


def _attention_bias(
    segment_ids: torch.Tensor, slopes: torch.Tensor, dtype: torch.dtype, key_segment_ids: Optional[torch.Tensor]
) -> torch.Tensor:
    seg_k = segment_ids if key_segment_ids is None else key_segment_ids
    Tq, Tk = segment_ids.shape[1], seg_k.shape[1]
    k_pos = torch.arange(Tk, device=segment_ids.device)
    q_pos = k_pos[Tk - Tq :]
    seg_q, seg_k = segment_ids[:, :, None], seg_k[:, None, :]
    allowed = (q_pos[None, :, None] >= k_pos[None, None, :]) & (seg_q == seg_k) & (seg_q != 0)
    allowed |= q_pos[:, None] == k_pos[None, :]
    alibi = slopes.float()[:, None, None] * (k_pos[None, :] - q_pos[:, None])  # [h, Tq, Tk]: −slope·(i − j)
    bias = torch.where(allowed[:, None], alibi[None], torch.finfo(dtype).min)
    return bias.to(dtype)


class KVCache:
    """One attention layer's keys and values of the positions decoded so far (greedy generation):
    each new token attends to them instead of the whole sequence being run again. A TP rank keeps
    its own heads' only. Positions are appended, never dropped, so the ALiBi distance of a key is
    its index's distance to the query's."""

    def __init__(self) -> None:
        self.k: Optional[torch.Tensor] = None  # [B, heads, S, head_dim]
        self.v: Optional[torch.Tensor] = None
        self.segment_ids: Optional[torch.Tensor] = None  # [B, S]

    def extend(
        self, k: torch.Tensor, v: torch.Tensor, segment_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append the new positions' keys, values and segment ids; all of them so far."""
        if self.k is None:
            self.k, self.v, self.segment_ids = k, v, segment_ids
        else:
            self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
            self.segment_ids = torch.cat([self.segment_ids, segment_ids], 1)
        return self.k, self.v, self.segment_ids  # type: ignore[return-value]


PAD_LOGIT = -1e4  # exp(-1e4 - max) is 0 in fp32; finite, so a slice of only padding is no NaN


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int, first_id: int = 0) -> torch.Tensor:
    """Give the padding columns (token ids >= ``vocab_size``; logits' column 0 is id ``first_id``)
    the logit PAD_LOGIT, in place.

    The table is padded only so it splits evenly over TP ranks. Masked, padding rows carry no
    probability and get no gradient, so the model does not depend on how far it is padded and a
    checkpoint re-padded for another TP is the same model. In place on the projection's output is
    safe: the matmul's backward needs its inputs, not its output."""
    start = max(0, vocab_size - first_id)
    if start < logits.shape[-1]:
        logits[..., start:] = PAD_LOGIT
    return logits


# ----------------------------------------------------------------------------- modules


class Embedding(nn.Module):
    """The word embedding, used at both ends (tied): ``(input_ids, segment_ids) → (hidden,
    segment_ids)``, and with ``project=True`` the output projection ``(hidden, _) → logits [B, T, V]``.

    The projection goes through ``forward`` (not a method of its own) because ZeRO-3 gathers a
    module's partitioned weights around its forward calls. V is the padded vocabulary; padding
    columns are masked (:func:`mask_padded_vocab`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # Uninitialised (init_weights draws every parameter): nn.Embedding's own normal_ init on the
        # meta device goes through torch._refs, whose first call imports TorchDynamo, 1.6 s of every
        # process that reads a checkpoint's parameter shapes (training/model/bloom.py full_shapes).
        shape = (cfg.padded_vocab(), cfg.hidden_size)
        self.word_embeddings = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.vocab_size = cfg.vocab_size
        # Set by tensor parallelism: the token id of this rank's first row, and an op that makes
        # the projection's input gradient sum over the ranks that each hold part of the vocabulary.
        self.first_row = 0
        self.project_input: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def forward(self, x: Activations, project: bool = False) -> Activations | torch.Tensor:
        if project:
            hidden = x[0] if self.project_input is None else self.project_input(x[0])
            return mask_padded_vocab(F.linear(hidden, self.word_embeddings.weight), self.vocab_size, self.first_row)
        input_ids, segment_ids = x
        return self.word_embeddings(input_ids), segment_ids


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the hidden state of an ``(hidden, segment_ids)`` pair."""

    def forward(self, x: Activations) -> Activations:  # type: ignore[override]
        hidden, segment_ids = x
        return super().forward(hidden), segment_ids


class Attention(nn.Module):
    """Causal self-attention with ALiBi, kept inside each document: x [B, T, H], segment_ids [B, T] → [B, T, H].

    Its heads are whatever ``qkv`` produces (``qkv.weight.shape[0] // (3·head_dim)``), starting at
    head ``first_head`` of the model's ``num_heads``, so a TP rank holding a slice of the qkv rows
    computes its heads unchanged.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.head_dim = cfg.head_dim
        self.total_heads = cfg.num_heads
        self.first_head = 0
        self.kernel = "flex" if cfg.attention == "flex" else "sdpa"  # auto: the trainer measures, then sets it
        self.qkv = nn.Linear(h, 3 * h)  # output rows: [heads, 3 (q, k, v), head_dim]
        self.dense = nn.Linear(h, h)

    @property
    def num_heads(self) -> int:
        return self.qkv.weight.shape[0] // (3 * self.head_dim)

    def forward(self, x: torch.Tensor, segment_ids: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        B, T, _ = x.shape
        # HF Bloom's layout: view the fused output as [B, T, heads, 3, head_dim].
        qkv = self.qkv(x).view(B, T, self.num_heads, 3, self.head_dim)
        q, k, v = (qkv[..., i, :].transpose(1, 2) for i in range(3))  # each [B, heads, T, head_dim]
        slopes = head_slopes(self.total_heads, self.first_head, self.num_heads, x.device)
        if cache is not None:  # generation: the new positions attend to every position so far
            k, v, keys = cache.extend(k, v, segment_ids)
            bias = attention_bias(segment_ids, slopes, q.dtype, key_segment_ids=keys)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        elif self.kernel == "flex":
            from training.model.attention import flex_document_attention

            out = flex_document_attention(q, k, v, segment_ids, slopes)
        else:
            bias = attention_bias(segment_ids, slopes, q.dtype)
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
    """Pre-LN transformer block: (hidden [B, T, H], segment_ids [B, T]) → (hidden, segment_ids)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Activations, cache: Optional[KVCache] = None) -> Activations:
        hidden, segment_ids = x
        hidden = hidden + self.attn(self.ln1(hidden), segment_ids, cache)
        return hidden + self.mlp(self.ln2(hidden)), segment_ids


class Bloom(nn.Module):
    """The whole model: input_ids [B, T], segment_ids [B, T] → logits [B, T, V] (V: padded vocabulary).

    ``Bloom(cfg, seed)`` is initialised by :func:`init_weights`; built under
    ``torch.device("meta")`` it holds no memory until ``to_empty`` + ``init_weights``.
    """

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embedding = Embedding(cfg)
        self.embed_ln = LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.final_ln = LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        if self.embed_ln.weight.device.type != "meta":
            init_weights(self, "", cfg, seed)

    def layers(self) -> list[tuple[str, nn.Module]]:
        """The layers in order with their names in ``state_dict``; the output projection
        (``embedding`` with ``project=True``) follows the last."""
        return [
            ("embedding", self.embedding),
            ("embed_ln", self.embed_ln),
            *((f"blocks.{i}", b) for i, b in enumerate(self.blocks)),
            ("final_ln", self.final_ln),
        ]

    def forward(
        self,
        input_ids: torch.Tensor,
        segment_ids: Optional[torch.Tensor] = None,
        caches: Optional[dict[str, KVCache]] = None,
    ) -> torch.Tensor:
        """segment_ids from :func:`segment_ids_from_offsets`; None: each row is one document, unpadded.
        ``caches`` (generation): each block's :class:`KVCache` by its name; ``input_ids`` are then
        the positions after the cached ones."""
        x: Activations = (input_ids, torch.ones_like(input_ids) if segment_ids is None else segment_ids)
        return self.embedding(run_layers(self.layers(), x, caches), project=True)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
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


def run_layers(
    layers: list[tuple[str, nn.Module]], x: Activations, caches: Optional[dict[str, KVCache]] = None
) -> Activations:
    """Run named layers (all of :meth:`Bloom.layers`, or one pipeline stage's) in order; a block
    named in ``caches`` attends through its cache."""
    for name, layer in layers:
        x = layer(x, caches[name]) if caches is not None and name in caches else layer(x)
    return x


# ----------------------------------------------------------------------------- initialisation


def _name_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def full_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Every parameter's name and whole (unsharded) shape at a config."""
    return dict(_shapes(tuple(sorted(dataclasses.asdict(cfg).items()))))


@lru_cache(maxsize=4)
def _shapes(cfg_items: tuple) -> tuple:
    with torch.device("meta"):
        return tuple((n, p.shape) for n, p in Bloom(ModelConfig(**dict(cfg_items))).named_parameters())


def initial_value(name: str, shape: torch.Size, cfg: ModelConfig, seed: int) -> torch.Tensor:
    """The whole initial tensor of parameter ``name`` (a ``Bloom.state_dict()`` name).

    BLOOM/HF init: normal(0, init_std) for linear and embedding weights, zero biases, LayerNorms
    weight 1 and bias 0. The embedding's padding rows (ids ≥ vocab_size) start at zero: they are
    never looked up and their logits are masked, so any value would do; zero is the same at any
    padding. Each weight's generator is seeded by (seed, name), so the value does not depend on
    which other modules exist on this rank or in which order they were built.
    """
    module, leaf = name.rsplit(".", 1)
    if module.rsplit(".", 1)[-1] in NORMS:
        return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    if leaf == "bias":
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(_name_seed(seed, name))
    w = torch.empty(shape).normal_(0.0, cfg.init_std, generator=g)
    if name == "embedding.word_embeddings.weight":
        w[cfg.vocab_size :] = 0
    return w


def init_weights(module: nn.Module, prefix: str, cfg: ModelConfig, seed: int) -> None:
    """Initialise every parameter of ``module`` (whose parameters are named ``prefix + local
    name`` in ``Bloom.state_dict()``) with :func:`initial_value`. (Tensor-parallel slices are
    filled by ``training.parallel.parallelize.build_on_device`` from the same values.)"""
    shapes = full_shapes(cfg)
    with torch.no_grad():
        for local, p in module.named_parameters():
            name = prefix + local
            p.copy_(initial_value(name, shapes[name], cfg, seed))
