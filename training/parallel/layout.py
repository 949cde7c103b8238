"""Where each of Bloom's parameters lives at a TP × PP × DP layout: the one mapping of names and
tensor-parallel cuts that parallelisation, checkpoints, conversion and loading all use.

* Names. A parameter's name is its name in ``Bloom.state_dict()`` (``blocks.3.attn.qkv.weight``)
  at every layout. Tensor parallelism keeps the names (its layers are swapped in place). Only a
  DeepSpeed ``PipelineModule`` renames: it registers its layers by index, in the order of
  ``Bloom.layers()`` followed by the output projection, and the tied embedding under
  ``tied_modules.embed``. :func:`pipeline_name` and :func:`bloom_name` convert.
* Tensor-parallel cuts (:func:`tp_dim`): column-parallel weights and biases (qkv, fc1) and the
  vocabulary-parallel embedding are cut along dim 0, row-parallel weights (dense, fc2) along
  dim 1; LayerNorms and the row-parallel biases (added once, after the all-reduce) are whole on
  every TP rank. The fused qkv rows are laid out per head, so a dim-0 slice is whole heads.

Free of torch.distributed, DeepSpeed and megatron-core, so loaders and tools import it cheaply.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

    from training.config import ModelConfig

LAYOUT_KEYS = ("tp", "pp", "dp", "zero_stage")
TIED_KEY = "embed"  # DeepSpeed's key of the tied embedding (first and last pipeline stage)
EMBEDDING = "embedding.word_embeddings.weight"

# suffix of a Bloom name → the dim its TP slices are cut along (None: whole on every TP rank)
_TP_RULES: list[tuple[str, Optional[int]]] = [
    (r"word_embeddings\.weight", 0),
    (r"(qkv|fc1)\.(weight|bias)", 0),
    (r"(dense|fc2)\.weight", 1),
    (r"(dense|fc2)\.bias", None),
    (r"(embed_ln|final_ln|ln1|ln2)\.(weight|bias)", None),
]


def layout_of(parallel: Any) -> dict[str, int]:
    """The layout part of a ParallelConfig (or of its dict in a checkpoint)."""
    get = parallel.get if isinstance(parallel, dict) else lambda k: getattr(parallel, k)
    return {k: int(get(k)) for k in LAYOUT_KEYS}


def layout_label(layout: dict[str, int]) -> str:
    return " ".join(f"{k}={layout[k]}" for k in LAYOUT_KEYS if k in layout)


def tp_dim(name: str) -> Optional[int]:
    """The dim along which parameter ``name`` (a Bloom name) is cut over TP ranks; None when
    every TP rank holds all of it. Raises KeyError for a name no rule covers."""
    for pattern, dim in _TP_RULES:
        if re.search(rf"(^|\.){pattern}$", name):
            return dim
    raise KeyError(f"no tensor-parallel rule for parameter {name}")


def tp_rules(names: list[str]) -> dict[str, Optional[int]]:
    """``{name: tp_dim(name)}``, as saved in every checkpoint's bloomline.json."""
    return {n: tp_dim(n) for n in names}


def pipeline_prefixes(num_layers: int) -> list[str]:
    """The Bloom module name of each pipeline layer index (``Bloom.layers()`` + the projection)."""
    return ["embedding", "embed_ln", *(f"blocks.{i}" for i in range(num_layers)), "final_ln", "embedding"]


def pipeline_name(name: str, num_layers: int) -> str:
    """A Bloom name as a ``PipelineModule`` names it (``blocks.0.ln1.weight`` → ``2.ln1.weight``)."""
    if name.startswith("embedding."):
        return f"tied_modules.{TIED_KEY}." + name[len("embedding.") :]
    prefixes = pipeline_prefixes(num_layers)
    for idx, prefix in enumerate(prefixes[1:-1], start=1):
        if name.startswith(prefix + "."):
            return f"{idx}." + name[len(prefix) + 1 :]
    raise KeyError(f"{name} is not a parameter of a {num_layers}-layer Bloom")


def bloom_name(name: str, num_layers: int) -> str:
    """The inverse of :func:`pipeline_name`; a name without a layer index is returned as is."""
    if name.startswith(f"tied_modules.{TIED_KEY}."):
        return "embedding." + name[len(f"tied_modules.{TIED_KEY}.") :]
    m = re.match(r"^(\d+)\.(.*)$", name)
    if not m:
        return name
    idx = int(m.group(1))
    prefixes = pipeline_prefixes(num_layers)
    if not 0 < idx < len(prefixes) - 1:
        raise KeyError(f"{name}: no layer {idx} in a {num_layers}-layer pipeline")
    return f"{prefixes[idx]}.{m.group(2)}"


def layout_name(name: str, layout: dict[str, int], num_layers: int) -> str:
    """A Bloom name as the model of ``layout`` names it."""
    return pipeline_name(name, num_layers) if layout["pp"] > 1 else name


def tp_slice(name: str, full: "torch.Tensor", rank: int, size: int, rows: int | None = None) -> "torch.Tensor":
    """TP rank ``rank``'s slice of the whole tensor of parameter ``name``. The embedding is first
    padded with zero rows to ``rows`` (the layout's padded vocabulary) when that is larger."""
    import torch

    dim = tp_dim(name)
    if name == EMBEDDING and rows is not None and rows > full.shape[0]:
        full = torch.cat([full, full.new_zeros(rows - full.shape[0], *full.shape[1:])])
    if dim is None or size == 1:
        return full
    if full.shape[dim] % size:
        raise ValueError(f"{name}: dim {dim} of {tuple(full.shape)} does not split over {size} TP ranks")
    return full.chunk(size, dim)[rank]


def first_mismatch(parts: list["torch.Tensor"]) -> Optional[int]:
    """The first TP rank whose copy of a replicated parameter differs from rank 0's (None: all equal)."""
    import torch

    return next((r for r, p in enumerate(parts[1:], start=1) if not torch.equal(p, parts[0])), None)


def tp_merge(name: str, parts: list["torch.Tensor"], dim: Optional[int], rows: int | None = None) -> "torch.Tensor":
    """The whole tensor from every TP rank's slice (the inverse of :func:`tp_slice`): the slices
    concatenated along ``dim``, or rank 0's copy when ``dim`` is None (check the copies with
    :func:`first_mismatch` first). The embedding is cut to ``rows`` (the single-device padded
    vocabulary) when a layout padded it further."""
    import torch

    whole = parts[0] if dim is None or len(parts) == 1 else torch.cat(parts, dim)
    if name == EMBEDDING and rows is not None and whole.shape[0] > rows:
        whole = whole[:rows]
    return whole


def universal_info(cfg: ModelConfig, layout: dict[str, int]) -> dict[str, Any]:
    """How DeepSpeed's converter merges this layout's TP slices (saved in every checkpoint).

    Exact names of the layout's parameters, grouped by their TP cut; dim-0 cuts are the
    converter's default. ``original_vocab_size`` is the layout's padded vocabulary: the converter
    keeps those rows (padding rows included, so a same-size resume is exact) and the loader pads
    with zeros when the new layout pads further."""
    from deepspeed.checkpoint import constants as c

    from training.model.bloom import full_shapes

    names = {n: layout_name(n, layout, cfg.num_layers) for n in full_shapes(cfg)}
    exact = lambda ns: [f"^{re.escape(names[n])}$" for n in ns]  # noqa: E731
    return {
        c.UNIVERSAL_CHECKPOINT_VERSION_KEY: c.UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        c.TP_REPLICATED_PARAMETER_PATTERNS: exact(n for n in names if tp_dim(n) is None),
        c.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: exact(n for n in names if tp_dim(n) == 1),
        c.VOCABULARY_PARAMETER_PATTERNS: exact([EMBEDDING]),
        # tied: held by the first and the last pipeline stage; the converter takes the first's
        c.PIPELINE_REPLICATED_PARAMETER_PATTERNS: exact([EMBEDDING]),
        c.ORIGINAL_VOCAB_SIZE: int(cfg.padded_vocab(tp=layout["tp"])),
    }
