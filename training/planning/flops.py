"""What a step costs: the model the sampler balances on, and the work the kernels really did.

FLOPs of one training step (forward + backward, PaLM's count, ``Bloom.flops_per_token``) split
in two parts:

* **linear**: 6·N per *padded* position (every position of a ``[m, T]`` micro-batch goes through
  the projections and the MLP, padding included);
* **attention**: 12·H per layer per (query, key) pair the kernel computes (QKᵀ and attention·V:
  4·H forward, twice that backward).

With activation checkpointing each block's forward runs again in the backward (2N and 4·L·H
more): not counted here, as MFU conventionally leaves it out (it is HFU's).

Which pairs are computed depends on the kernel (``model.attention``):

* ``sdpa`` adds a dense ``[T, T]`` bias: it computes all m·T² pairs, whatever the documents;
* ``flex`` computes the tiles of its block mask (training/model/attention.py): a 128×128 tile is
  skipped when no query of it may see a key of it, so the work follows the documents.

The sampler's **cost model** (:func:`sample_cost`) is what can be known before a step from the
shard index alone: a sample of bucket T with documents d₁…d_k costs ``T + w·Σ dᵢ(dᵢ+1)/2``
(the pairs a document-causal mask admits) in units of one padded position's linear FLOPs. The
trainer's **computed work** (:func:`computed_pairs`) is read off the masks the kernels ran with.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch


def pair_weight(num_layers: int, hidden_size: int, num_params: int) -> float:
    """FLOPs of one attended (query, key) pair over the FLOPs of one position's linear part:
    12·L·H / 6·N (bloom-560m: 8.8e-5: a sample of one 2048-token document costs 2048 + 185, of ten
    documents of 205 tokens 2048 + 19)."""
    return 12 * num_layers * hidden_size / (6 * num_params)


def model_params(cfg: Any) -> int:
    """N of a ``ModelConfig`` (``Bloom.num_params``), counted from its shapes without building it."""
    from training.model.bloom import full_shapes

    return sum(int(np.prod(s)) for s in full_shapes(cfg).values())


def model_pair_weight(cfg: Any) -> float:
    """:func:`pair_weight` of a ``ModelConfig``."""
    return pair_weight(cfg.num_layers, cfg.hidden_size, model_params(cfg))


def document_pairs(doc_offsets: np.ndarray, length: int) -> int:
    """(query, key) pairs a document-causal mask admits in one sample: Σ dᵢ(dᵢ+1)/2."""
    d = np.diff(np.append(np.asarray(doc_offsets, dtype=np.int64), length))
    return int((d * (d + 1) // 2).sum())


def sample_cost(padded: np.ndarray, pairs: np.ndarray, weight: float) -> np.ndarray:
    """The sampler's cost of samples: padded length + weight · admitted pairs."""
    return padded.astype(np.float64) + weight * pairs.astype(np.float64)


def computed_pairs(segment_ids: torch.Tensor, kernel: str) -> int:
    """(query, key) pairs per head per layer that ``kernel`` computes for a micro-batch
    (``segment_ids`` [m, T], as the model receives it)."""
    m, T = segment_ids.shape
    if kernel == "sdpa":
        return m * T * T
    if kernel != "flex":
        raise ValueError(f"unknown attention kernel {kernel!r}")
    from training.model.attention import BLOCK_SIZE, document_block_mask

    tiles = document_block_mask(segment_ids).to_dense()[:, 0].to(torch.int64)  # [m, q tiles, kv tiles]: 1 = computed
    size = torch.full((tiles.shape[-1],), BLOCK_SIZE, dtype=torch.int64, device=tiles.device)
    size[-1] = T - BLOCK_SIZE * (tiles.shape[-1] - 1)  # the last tile holds what is left of T
    return int(torch.einsum("bqk,q,k->", tiles, size[: tiles.shape[1]], size).item())


def step_flops(
    batches: list[dict[str, torch.Tensor]], kernel: str, num_layers: int, hidden_size: int, num_params: int
) -> tuple[float, float]:
    """(linear FLOPs, attention FLOPs) that one replica computes on these micro-batches."""
    linear = sum(6.0 * num_params * b["segment_ids"].numel() for b in batches)
    attention = sum(12.0 * num_layers * hidden_size * computed_pairs(b["segment_ids"], kernel) for b in batches)
    return linear, attention


def balance_over_dp(rows: np.ndarray) -> Optional[float]:
    """max / mean over data-parallel ranks of a per-rank figure, the worst model-parallel position.

    ``rows`` [world, 4]: (dp_rank, tp_rank, pp_rank, value) of every rank. Ranks at the same
    (tp, pp) position all-reduce gradients together, so each position's DP ranks are compared
    with each other. Positions that measured nothing (all 0: a middle pipeline stage reads no
    batch to count) are left out; None when none measured anything."""
    worst: Optional[float] = None
    for pos in sorted({(int(t), int(p)) for t, p in rows[:, 1:3]}):
        v = rows[(rows[:, 1] == pos[0]) & (rows[:, 2] == pos[1]), 3]
        if v.mean() > 0:
            worst = max(worst or 0.0, float(v.max() / v.mean()))
    return worst


class ForwardTimer:
    """Measured compute time of one rank's forward passes in a step (hooks on the root module).

    Only the forward is timed: in DeepSpeed the backward of the step's last micro-batch carries
    the gradient reduction, so its wall time includes waiting for the slowest rank and would
    hide an imbalance; the forward has no data-parallel communication. The backward's FLOPs are
    twice the forward's for the same masks, so the forward's balance is the step's compute
    balance. On CUDA the device is synchronised at both ends (kernels run asynchronously)."""

    def __init__(self, module: torch.nn.Module):
        import time

        self._clock, self.seconds, self._t0 = time.perf_counter, 0.0, 0.0
        self._sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        self._hooks = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop)]

    def _start(self, *_: Any) -> None:
        self._sync()
        self._t0 = self._clock()

    def _stop(self, *_: Any) -> None:
        self._sync()
        self.seconds += self._clock() - self._t0

    def take(self) -> float:
        """Seconds timed since the last call."""
        s, self.seconds = self.seconds, 0.0
        return s

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
