"""The model's shape: ``model:`` of a training recipe, or a file in ``configs/model/``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from bloomline.config import check
from bloomline.errors import ConfigError

DATA_SHAPED = ("vocab_size", "seq_len")
"""The model's values that may be left to the prepared data (None): :meth:`ModelConfig.fit_to_data`."""


@dataclass
class ModelConfig:
    vocab_size: Optional[int] = 250_680
    """The tokenizer's vocabulary size, before padding (BLOOM: 250,680); the data's manifest must
    give the same (``data_prep.storage.shards.check_model_fits``). None: the prepared data's tokenizer's
    (:meth:`fit_to_data`; ``bloomline pipeline`` leaves it to the data unless its recipe sets it)."""
    hidden_size: int = 1024
    """Width of the residual stream."""
    num_layers: int = 24
    """Transformer blocks."""
    num_heads: int = 16
    """Attention heads (ALiBi slopes are per head)."""
    seq_len: Optional[int] = 2048
    """Longest sample (the data's largest bucket must not exceed it). None: the data's largest
    bucket (:meth:`fit_to_data`)."""
    ffn_mult: int = 4
    """MLP width = ffn_mult × hidden_size (BLOOM: 4)."""
    layernorm_eps: float = 1e-5
    """LayerNorm epsilon."""
    init_std: float = 0.0048
    """Std of the normal weight init (BLOOM-176B: 0.0048, ≈ sqrt(1/(3·hidden)) for hidden 14336)."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """Attention kernel: ``sdpa`` (dense ALiBi + document bias, the reference; trains everywhere),
    ``flex`` (FlexAttention, block-sparse over documents, training/model/attention.py; no CPU backward in
    torch 2.13, so CPU training needs sdpa), or ``auto``: the trainer times one block's step with
    each kernel that can train here on a micro-batch of the data and takes the faster (on CPU:
    sdpa, the only one); evaluation and export read ``auto`` as sdpa. The same function either way."""
    make_vocab_divisible_by: int = 128
    """Without pad_vocab_to, the embedding is padded to a multiple of this × TP (Megatron's rule)."""
    pad_vocab_to: Optional[int] = None
    """Pad the embedding to exactly this many rows at every TP (Megatron-DeepSpeed's
    ``--pad-vocab-size-to``, which BigScience used for the smaller BLOOMs: 250,880 rows, the size in
    their published configs); must split over TP. None: Megatron's rule above."""

    def validate(self) -> None:
        for k in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "seq_len",
            "ffn_mult",
            "make_vocab_divisible_by",
        ):
            if getattr(self, k) is None and k in DATA_SHAPED:
                continue  # left to the data (fit_to_data)
            check(getattr(self, k) >= 1, k, "must be >= 1")
        check(
            self.hidden_size % self.num_heads == 0,
            "hidden_size",
            f"{self.hidden_size} is not divisible by num_heads={self.num_heads}",
        )
        if self.vocab_size is None:
            return  # the pad_vocab_to checks wait for the data's vocabulary (fit_to_data)
        check(
            self.pad_vocab_to is None or self.pad_vocab_to >= self.vocab_size,
            "pad_vocab_to",
            f"{self.pad_vocab_to} is smaller than vocab_size={self.vocab_size}",
        )
        # pad_vocab_to fixes the table of a known tokenizer (BLOOM-560m: 250,880 rows for 250,680
        # pieces); kept after vocab_size changed to another tokenizer's, it would silently compute
        # and count thousands of padding logits per token.
        check(
            self.pad_vocab_to is None or self.pad_vocab_to - self.vocab_size < 8 * self.make_vocab_divisible_by,
            "pad_vocab_to",
            f"{self.pad_vocab_to} rows for a {self.vocab_size}-piece tokenizer would be "
            f"{(self.pad_vocab_to or 0) - self.vocab_size} rows of padding: set model.pad_vocab_to=null to pad by "
            f"Megatron's rule, or to the size this tokenizer's table should have",
        )

    def fit_to_data(self, vocab_size: int, largest_bucket: int) -> list[str]:
        """Fill what the recipe left to the data (None): the vocabulary from the data's tokenizer
        (the embedding then padded by ``make_vocab_divisible_by``), the sequence length from its
        largest bucket. Returns one line per value derived. Values the recipe set stay as set:
        ``data_prep.storage.shards.check_model_fits`` refuses one that contradicts the data."""
        said = []
        if self.vocab_size is None:
            self.vocab_size = vocab_size
            said.append(
                f"model.vocab_size = {vocab_size} (the prepared tokenizer's; {self.padded_vocab()} embedding rows)"
            )
        if self.seq_len is None:
            self.seq_len = largest_bucket
            said.append(f"model.seq_len = {largest_bucket} (the data's largest bucket)")
        if said:
            self.validate()
        return said

    def padded_vocab(self, tp: int = 1) -> int:
        """Rows of the embedding table at tensor-parallel degree ``tp`` (padding rows are masked,
        so the model is the same function at any padding)."""
        if self.pad_vocab_to is not None:
            return self.pad_vocab_to
        if self.vocab_size is None:
            raise ConfigError("model.vocab_size", "left to the data, but no data was given to take it from")
        m = self.make_vocab_divisible_by * tp
        return ((self.vocab_size + m - 1) // m) * m

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads
