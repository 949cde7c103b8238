"""Document-causal ALiBi attention with PyTorch's FlexAttention (``model.attention: flex``).

The reference path (``sdpa``, training/model.py) materialises a dense ``[B, heads, T, T]`` bias of
ALiBi plus the document mask in every layer, and computes every query against every key of the
sample, most of which lie across document boundaries in packed data. Here, as torchtitan does
for document masking:

* the mask is a ``BlockMask`` (block-sparse: tiles wholly across documents are never computed),
  built once per micro-batch from its ``segment_ids`` and shared by every layer;
* ALiBi is a ``score_mod``: −slope[h]·(q − kv) added to each computed score;
* ``flex_attention`` is compiled (its eager form is a dense reference implementation).

Semantics equal the reference exactly: a query sees keys of its own document at or before it; a
padding query (segment 0) sees only itself, so no row is empty.

Limit, measured with torch 2.13: FlexAttention has no backward on CPU ("FlexAttention does not
support backward on CPU"), so on CPU it serves evaluation (forward only) and training uses
``sdpa``; flows/stages/train_job.py refuses ``flex`` for CPU training with that reason.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

# Tile of the block mask (FlexAttention's default): a tile is skipped when no query of it may
# see any key of it, so smaller tiles follow short documents more closely, at more bookkeeping.
BLOCK_SIZE = 128
_CACHE_SLOTS = 8  # micro-batches whose masks are kept: activation recompute revisits older ones

_masks: list[tuple[weakref.ref, Any]] = []
_compiled: Callable[..., torch.Tensor] | None = None


def document_block_mask(segment_ids: torch.Tensor) -> Any:
    """The BlockMask of ``segment_ids`` [B, T] (1-based document index, 0 = padding), cached for
    as long as that tensor lives: every layer of a micro-batch gets the same one."""
    for ref, mask in _masks:
        if ref() is segment_ids:
            return mask
    from torch.nn.attention.flex_attention import create_block_mask

    seg = segment_ids

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return ((q >= kv) & (seg[b, q] == seg[b, kv]) & (seg[b, q] != 0)) | (q == kv)

    B, T = seg.shape
    mask = create_block_mask(mask_mod, B, None, T, T, device=seg.device, BLOCK_SIZE=BLOCK_SIZE)
    _masks.insert(0, (weakref.ref(segment_ids), mask))
    del _masks[_CACHE_SLOTS:]
    return mask


def alibi_score_mod(slopes: torch.Tensor) -> Callable[..., Any]:
    """ALiBi for the heads whose slopes are given (a TP rank's slice): score − slope[h]·(q − kv)."""

    def score_mod(score: Any, b: Any, h: Any, q: Any, kv: Any) -> Any:
        return score - slopes[h] * (q - kv)

    return score_mod


def flex_document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment_ids: torch.Tensor, slopes: torch.Tensor
) -> torch.Tensor:
    """[B, heads, T, head_dim] each → the same shape; scale 1/sqrt(head_dim), as SDPA's."""
    global _compiled
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise RuntimeError(
            "model.attention=flex cannot train on CPU: FlexAttention has no CPU backward in torch "
            f"{torch.__version__}; use model.attention=sdpa here (flex serves evaluation on CPU)"
        )
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled(q, k, v, score_mod=alibi_score_mod(slopes.float()), block_mask=document_block_mask(segment_ids))
