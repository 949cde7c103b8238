"""The optimisation, the loop and its checkpoints: ``optim:``, ``train:``, ``checkpoint:``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from bloomline.config import Location, check
from bloomline.storage import CREDENTIALS_HINT, has_user_part


@dataclass
class OptimConfig:
    lr: float = 6e-5
    """Peak learning rate (BLOOM-176B: 6e-5)."""
    min_lr: float = 6e-6
    """Floor of the cosine decay (BLOOM-176B: 6e-6)."""
    warmup_steps: int = 375
    """Linear warm-up steps."""
    decay_steps: Optional[int] = None
    """Cosine decay length in steps; None: until train.steps."""
    beta1: float = 0.9
    """Adam β1."""
    beta2: float = 0.95
    """Adam β2 (BLOOM: 0.95)."""
    eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.1
    """AdamW weight decay (not on biases and LayerNorms)."""
    clip_grad: float = 1.0
    """Global gradient-norm clipping (BLOOM: 1.0)."""

    def validate(self) -> None:
        check(self.lr > 0, "lr", "must be > 0")
        check(0 <= self.min_lr <= self.lr, "min_lr", f"must be between 0 and lr={self.lr}")
        check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        check(
            self.decay_steps is None or self.decay_steps > self.warmup_steps,
            "decay_steps",
            f"must be larger than warmup_steps={self.warmup_steps} (the cosine runs from the end of warm-up "
            "to decay_steps), or null to decay until train.steps",
        )
        check(0 <= self.beta1 < 1, "beta1", "must be in [0, 1)")
        check(0 <= self.beta2 < 1, "beta2", "must be in [0, 1)")
        check(self.eps > 0, "eps", "must be > 0")
        check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        check(self.clip_grad >= 0, "clip_grad", "must be >= 0")


@dataclass
class TrainLoopConfig:
    steps: int = 100
    """Optimizer steps to train for."""
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """bf16 (BLOOM), fp16 with dynamic loss scaling, or fp32."""
    fp16_initial_scale_power: int = 16
    """fp16 dynamic loss scaling starts at 2**this (DeepSpeed's and Megatron's default 16)."""
    fp16_loss_scale_window: int = 1000
    """Double the loss scale after this many steps without overflow (Megatron's default)."""
    fp16_hysteresis: int = 2
    """Overflows tolerated before the scale is halved (Megatron's default 2)."""
    fp16_min_loss_scale: float = 1.0
    """The scale never drops below this; an overflow at the minimum stops the job."""
    activation_checkpointing: bool = True
    """Recompute each block's activations in the backward pass (memory for compute)."""
    compile: bool = False
    """``torch.compile`` each transformer block (after TP and activation checkpointing, as
    torchtitan does). Off by default: 0.87x eager's tokens/s on a 2-core AMD EPYC (bench/compile.py);
    bench/gpu/run.sh measures it on a GPU."""
    seed: int = 1234
    """Seed of initialisation, dropout-free training and the sampler."""
    init_from: Optional[Location] = None
    """Start from existing weights instead of the seed's: a Hugging Face BLOOM folder (config.json
    and safetensors, sharded too) or a bloomline checkpoint (a step folder, or a run folder: its
    latest), of any layout. Weights only: the optimizer, schedule and data order start fresh. The
    model's shape must be theirs (training/hf/from_hf.py). A run that has a checkpoint of
    its own resumes from that."""
    skip_spike_factor: float = 0.0
    """Skip a batch whose loss exceeds this × the running mean loss (0: off); NaN/inf always skip."""
    max_skipped_in_a_row: int = 20
    """Stop with an error after this many skipped batches in a row."""
    log_interval: int = 1
    """Print a progress line (step, loss, LR, tokens/s) every this many steps; metrics.jsonl and
    TensorBoard get every step regardless."""

    def validate(self) -> None:
        check(self.steps >= 1, "steps", "must be >= 1")
        check(self.log_interval >= 1, "log_interval", "must be >= 1")
        check(self.max_skipped_in_a_row >= 0, "max_skipped_in_a_row", "must be >= 0")
        check(self.skip_spike_factor == 0 or self.skip_spike_factor > 1, "skip_spike_factor", "0 (off) or > 1")
        check(0 <= self.fp16_initial_scale_power <= 64, "fp16_initial_scale_power", "must be in [0, 64]")
        check(self.fp16_loss_scale_window >= 1, "fp16_loss_scale_window", "must be >= 1")
        check(self.fp16_hysteresis >= 1, "fp16_hysteresis", "must be >= 1")
        check(self.fp16_min_loss_scale > 0, "fp16_min_loss_scale", "must be > 0")
        check(not (self.init_from and has_user_part(self.init_from)), "init_from", CREDENTIALS_HINT)


@dataclass
class CheckpointConfig:
    interval: int = 100
    """Save every this many steps (and at the end)."""
    keep: int = 3
    """Keep the newest this many checkpoints."""
    max_restarts: int = 3
    """The train flow restarts a failed job from `latest` at most this many times."""
    mirror: Location = ""
    """A URL (``s3://bucket/runs/x``, any fsspec URL) each saved checkpoint is uploaded to, in the
    background, with ``latest`` moved there last (training/checkpoint/mirror.py); a run folder with
    no checkpoint (a fresh node) resumes from the mirror's latest. Credentials from the standard
    environment, never here."""

    def validate(self) -> None:
        check(self.interval >= 1, "interval", "must be >= 1")
        check(self.keep >= 1, "keep", "must be >= 1")
        check(self.max_restarts >= 0, "max_restarts", "must be >= 0")
        check(not has_user_part(self.mirror), "mirror", CREDENTIALS_HINT)
