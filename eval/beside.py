"""Where the evaluation beside training runs (``evaluation.gpus``): never on a training rank's GPU
unless the recipe lists it. A rank holds its GPU's memory nearly whole, so an evaluator loading a
model beside it (``device: auto`` finds ``cuda:0``, rank 0's GPU) runs that rank out of memory, or
itself. The ranks of a node take its first GPUs (training/parallel/distributed.py: local rank
modulo the GPU count), so the evaluator gets the node's GPUs after them, and the CPU when there are
none: the watcher's CUDA_VISIBLE_DEVICES is set to those (flows/stages/train.py ``start_watcher``), and
``bloomline plan`` says which they are."""

from __future__ import annotations

from typing import Optional

from bloomline.errors import ConfigError


def evaluator_gpus(listed: Optional[list[int]], node_gpus: int, ranks_on_node: int) -> list[int]:
    """The GPU indices (of the node's ``node_gpus``) the evaluation beside training may use:
    ``listed`` (``evaluation.gpus``) when given, else those no training rank of the node takes
    (``ranks_on_node`` of them take the first); empty: the CPU."""
    if listed is not None:
        bad = [g for g in listed if not 0 <= g < node_gpus]
        if bad:
            raise ConfigError(
                "evaluation.gpus",
                f"{bad}: this node has GPUs 0 to {node_gpus - 1}" if node_gpus else f"{bad}: this node has no GPU",
            )
        return list(listed)
    return list(range(min(ranks_on_node, node_gpus), node_gpus))


def visible_devices(gpus: list[int], parent: Optional[str]) -> str:
    """CUDA_VISIBLE_DEVICES for a process given ``gpus`` (indices among those its parent sees:
    ``parent``, the parent's own CUDA_VISIBLE_DEVICES, or all); "" hides every GPU (the CPU)."""
    seen = [d.strip() for d in parent.split(",") if d.strip()] if parent else None
    return ",".join(seen[g] if seen is not None else str(g) for g in gpus)


def where(gpus: list[int]) -> str:
    """In words, for ``bloomline plan`` and the train flow's log."""
    if not gpus:
        return "the CPU (every GPU of the node holds a training rank; evaluation.gpus lists one to share)"
    return f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))} of the node, which no training rank uses"
