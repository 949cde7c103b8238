"""What DeepSpeed is told: its config for a recipe, the optimizer and its parameter groups, and the
CPU fp16 gate. training/parallel/parallelize.py hands them to DeepSpeed with the model."""

from __future__ import annotations

from typing import Any

import torch

from training.config import OptimConfig, ParallelConfig, TrainRecipe


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases and LayerNorm parameters (as Megatron)."""
    decay, no_decay = [], []
    for _name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(groups: list[dict[str, Any]], o: OptimConfig, parallel: ParallelConfig) -> torch.optim.Optimizer:
    """AdamW with the recipe's hyper-parameters over ``groups`` (:func:`param_groups`). Offloaded
    (``parallel.offload_optimizer``), it is DeepSpeed's CPU Adam in AdamW mode: the same update
    (decoupled weight decay, bias correction, fp32 moments) in SIMD, multithreaded C++ on the CPU
    partitions; DeepSpeed refuses torch's AdamW there, as it is several times slower on the CPU.
    Building the op compiles C++ once (cached under ~/.cache/torch_extensions). Either resumes the
    other's checkpoint: the moments and step are the same tensors."""
    hyper = {"lr": o.lr, "betas": (o.beta1, o.beta2), "eps": o.eps}
    if parallel.offload_optimizer == "none":
        return torch.optim.AdamW(groups, **hyper)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    opt = DeepSpeedCPUAdam(groups, adamw_mode=True, **hyper)
    # Loading replaces the groups by the saved ones; torch's AdamW saved none of CPU Adam's own
    # keys (bias_correction), which its step reads: offload switched on mid-run would fail.
    opt.register_load_state_dict_post_hook(_default_group_keys)
    return opt


def _default_group_keys(opt: torch.optim.Optimizer) -> None:
    for g in opt.param_groups:
        for k, v in opt.defaults.items():
            g.setdefault(k, v)


def deepspeed_config(recipe: TrainRecipe, load_universal: bool = False) -> dict[str, Any]:
    t = recipe.train
    p = t.precision
    return {
        # One nominal sample per micro-batch: our micro-batches have as many samples as the step's
        # bucket allows, and the number of micro-batches (gas) is set per step.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": recipe.optim.clip_grad,
        "bf16": {"enabled": p == "bf16", "check_grad_overflow": True},  # NaN/inf grads skip the step
        # loss_scale 0 = dynamic: an overflow skips the step and (after `hysteresis` of them) halves
        # the scale; `loss_scale_window` clean steps double it.
        "fp16": {
            "enabled": p == "fp16",
            "loss_scale": 0,
            "initial_scale_power": t.fp16_initial_scale_power,
            "loss_scale_window": t.fp16_loss_scale_window,
            "hysteresis": t.fp16_hysteresis,
            "min_loss_scale": t.fp16_min_loss_scale,
        },
        "zero_optimization": {"stage": recipe.parallel.zero_stage, **offload(recipe.parallel)},
        "zero_allow_untested_optimizer": True,
        # Send whole activations between stages: DeepSpeed's TP-partitioned sends cache their
        # partition metadata, which breaks when the bucket (sequence length) changes between steps.
        "pipeline": {"pipe_partitioned": False, "grad_partitioned": False},
        # resuming another layout's checkpoint, converted by training/checkpoint/reshard.py
        "checkpoint": {"load_universal": load_universal},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def offload(parallel: ParallelConfig) -> dict[str, Any]:
    """``zero_optimization``'s offload keys: none unless offloaded, so other recipes' configs are unchanged.
    Pinned (page-locked) host buffers let the GPU copy gradients and weights asynchronously; on the CPU
    accelerator pinning is a no-op."""
    if parallel.offload_optimizer == "none":
        return {}
    return {"offload_optimizer": {"device": parallel.offload_optimizer, "pin_memory": True}}


def allow_cpu_fp16() -> None:
    """Lift DeepSpeed's CPU fp16 gate (BLOOMLINE_CPU_FP16, training/config/drills.py). The gate asks whether oneDNN has fp16
    kernels on this CPU; without them torch falls back to its reference half kernels, which are
    slow but compute the same fp16 arithmetic, so DeepSpeed's fp16 optimizer and loss scaler run."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if not acc.is_fp16_supported():
        type(acc).is_fp16_supported = lambda self: True
