"""The learning-rate schedule, and what a resume with other settings does to it."""

from __future__ import annotations

import math
from typing import Optional

from training.config import TrainRecipe

# the recipe keys the schedule depends on
SCHEDULE_KEYS = (
    ("train", "steps"),
    ("optim", "decay_steps"),
    ("optim", "warmup_steps"),
    ("optim", "lr"),
    ("optim", "min_lr"),
)


def lr_at(step: int, recipe: TrainRecipe) -> float:
    """Linear warm-up to optim.lr, then cosine decay to optim.min_lr over optim.decay_steps
    (default: train.steps), flat after (BLOOM, Megatron)."""
    o = recipe.optim
    if o.warmup_steps and step <= o.warmup_steps:
        return o.lr * step / o.warmup_steps
    decay = o.decay_steps or recipe.train.steps
    progress = min(1.0, (step - o.warmup_steps) / max(1, decay - o.warmup_steps))
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + math.cos(math.pi * progress))


def schedule_change(before: TrainRecipe, after: TrainRecipe, step: int) -> Optional[str]:
    """When a run resumed after ``step`` has other schedule settings than the run that wrote the
    checkpoint: one plain sentence naming them and the LR of the next step before and after
    (e.g. raising train.steps stretches the cosine, so the LR jumps back up). None otherwise."""
    changed = [
        f"{sec}.{key} {getattr(getattr(before, sec), key)} → {getattr(getattr(after, sec), key)}"
        for sec, key in SCHEDULE_KEYS
        if getattr(getattr(before, sec), key) != getattr(getattr(after, sec), key)
    ]
    if not changed:
        return None
    a, b = lr_at(step + 1, before), lr_at(step + 1, after)
    jump = (
        "unchanged"
        if math.isclose(a, b, rel_tol=1e-9)
        else f"{a:.4g} → {b:.4g} ({(b - a) / a:+.1%})"
        if a
        else f"{a:.4g} → {b:.4g}"
    )
    return (
        f"resuming at step {step} with another LR schedule ({', '.join(changed)}): the LR of step {step + 1} is {jump}"
    )
