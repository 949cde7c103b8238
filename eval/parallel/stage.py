"""One rank's part of the model for evaluation: its pipeline stage's layers, cut as training cuts
them (training/planning/planner.py ``stage_layout``, DeepSpeed's ``partition_balanced``), each
with this rank's tensor-parallel slice, read from a checkpoint of any layout.

The model is built on the meta device and given megatron-core's TP layers from outside, as for
training (training/parallel/parallelize.py ``apply_tp``); only this stage's layers are then
materialised, from the checkpoint's tensors of those layers alone (training/checkpoint/load.py
``merged_weights``: the checkpoint's TP slices merged, then re-cut for this layout by
``build_on_device``), one layer at a time so a rank never holds more than one layer's whole
tensors beside its slices. ZeRO-3 checkpoints are the exception: DeepSpeed's ``zero_to_fp32``
gathers a model-parallel rank's partitions all at once, so their stage's layers are read together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from eval.published import Weights
from training.checkpoint.meta import model_config
from training.config import ParallelConfig
from training.model.bloom import Bloom, Embedding
from training.parallel.layout import pipeline_prefixes
from training.parallel.parallelize import apply_tp, build_on_device, megatron_config
from training.planning.planner import stage_layout


@dataclass
class Stage:
    """This rank's layers and where they sit."""

    layers: list[tuple[str, nn.Module]]
    """The stage's layers in order, by their ``Bloom.layers()`` names."""
    projection: Optional[Embedding]
    """The tied output projection (the word embedding's slice), on the last stage only."""
    first: bool
    last: bool
    cfg: Any
    """training.config.ModelConfig."""


def stage_layers(cfg: Any, pp: int, pp_rank: int) -> tuple[list[str], bool]:
    """The ``Bloom.layers()`` names of stage ``pp_rank`` and whether it ends with the projection."""
    prefixes = pipeline_prefixes(cfg.num_layers)  # Bloom.layers() + the projection
    start, stop = stage_layout(cfg, pp)[pp_rank]
    return [prefixes[i] for i in range(start, min(stop, len(prefixes) - 1))], stop == len(prefixes)


def build_stage(
    weights: Weights,
    together: bool,
    meta: dict[str, Any],
    tp: int,
    pp: int,
    pp_rank: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Stage:
    """Stage ``pp_rank`` of a tp × pp layout for this TP rank (megatron-core's groups must exist),
    from ``weights`` (eval/published.py ``weights_of``: a checkpoint's or a published folder's),
    read layer by layer unless the layers must be read ``together``."""
    cfg = model_config(meta)
    with torch.device("meta"):
        model = Bloom(cfg)
    apply_tp(model, megatron_config(ParallelConfig(tp=tp, pp=pp), dtype))
    modules = dict(model.layers())
    names, last = stage_layers(cfg, pp, pp_rank)
    wanted = [*names, *(["embedding"] if last and "embedding" not in names else [])]
    whole = weights(set(wanted)) if together else None
    for name in wanted:
        tensors = whole if whole is not None else weights({name})
        build_on_device(modules[name], name + ".", tensors.__getitem__, device).to(dtype).eval()
        del tensors
    return Stage(
        layers=[(n, modules[n]) for n in names],
        projection=model.embedding if last else None,
        first=pp_rank == 0,
        last=last,
        cfg=cfg,
    )
