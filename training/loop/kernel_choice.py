"""``model.attention: auto``: the trainer times one block's training step with each kernel that can
train on the machine (training/model/attention.py ``flex``, training/model/bloom.py ``sdpa``), on a real
micro-batch of the largest bucket, and every rank runs rank 0's choice."""

from __future__ import annotations

import time
from typing import Any

import torch


def measure_kernels(
    cfg: Any,
    segment_ids: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
    heads: int | None = None,
    repeats: int = 3,
) -> dict[str, float]:
    """Seconds of one block's training step (forward + backward) with each kernel that can train
    on ``device``, on a real micro-batch's ``segment_ids`` (the resolution of ``model.attention:
    auto``). ``heads``: the heads this rank computes (TP); the first call of each kernel (flex's
    compile) is not timed. On CPU only ``sdpa`` trains (see the module docstring): no timing."""
    if device.type == "cpu":
        return {"sdpa": float("nan")}
    import dataclasses

    from training.model.bloom import Block

    heads = heads or cfg.num_heads
    local = dataclasses.replace(cfg, hidden_size=heads * cfg.head_dim, num_heads=heads)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seg = segment_ids.to(device)
    x = torch.randn(*seg.shape, local.hidden_size, device=device, dtype=dtype, requires_grad=True)
    out: dict[str, float] = {}
    for kernel in ("sdpa", "flex"):
        block = Block(dataclasses.replace(local, attention=kernel)).to(device=device, dtype=dtype)

        def step() -> None:
            block((x, seg))[0].float().square().mean().backward()

        step()
        sync()
        t0 = time.perf_counter()
        for _ in range(repeats):
            step()
        sync()
        out[kernel] = (time.perf_counter() - t0) / repeats
    return out


def choose_kernel(timings: dict[str, float]) -> str:
    """The faster kernel of :func:`measure_kernels` (sdpa when it is the only one)."""
    if len(timings) == 1:
        return next(iter(timings))
    return min(timings, key=timings.__getitem__)


def set_kernel(module: torch.nn.Module, kernel: str) -> None:
    """Make every attention layer under ``module`` use ``kernel``."""
    from training.model.bloom import Attention

    for m in module.modules():
        if isinstance(m, Attention):
            m.kernel = kernel


def resolve_attention(
    recipe: Any, index: Any, sampler: Any, dtype: torch.dtype, device: torch.device, mesh: Any, module: torch.nn.Module
) -> str:
    """The trainer's kernel: ``model.attention``, with ``auto`` resolved by :func:`measure_kernels`
    on a real micro-batch of the largest bucket (read without advancing the sampler) and set on
    every layer of ``module``; rank 0's choice, so every rank runs the same kernel."""
    import numpy as np

    from training.data.shard_reader import collate

    cfg = recipe.model
    if cfg.attention != "auto":
        return cfg.attention
    stream = max(sampler.streams, key=lambda s: (s.bucket, s.size))
    m = min(max(1, recipe.batch.micro_batch_tokens // stream.bucket), stream.size)
    sids, rows = stream.locate(np.arange(m))
    seg = collate(index, list(zip(sids.tolist(), rows.tolist())), stream.bucket, index.pad_id)["segment_ids"]
    timings = measure_kernels(cfg, seg, dtype, device, heads=cfg.num_heads // mesh.tp)
    box = [(choose_kernel(timings), timings)]
    torch.distributed.broadcast_object_list(box, src=0)
    kernel, timings = box[0]
    set_kernel(module, kernel)
    if mesh.rank == 0:
        how = (
            "FlexAttention has no CPU backward"
            if device.type == "cpu"
            else ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in timings.items()) + " per block step"
        )
        print(f"model.attention=auto: {kernel} ({how})", flush=True)
    return kernel
