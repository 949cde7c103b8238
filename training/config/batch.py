"""Dynamic batches and the language mixture while training runs: ``batch:``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional

from bloomline.config import Location, check
from bloomline.errors import ConfigError


@dataclass
class OnlineMixtureConfig:
    """``batch.online``: how an online mixture moves the language weights (training/data/mixture/controller.py)."""

    rule: Literal["bandit", "evaluation"] = "bandit"
    """``bandit``: exponential weights over the smoothed per-language training loss (Online Data
    Mixing, Albalak et al. 2023, arXiv 2312.02406). ``evaluation``: each checkpoint's held-out
    bits per byte, excess over a reference run (DoReMi, Xie et al. 2023, arXiv 2305.10429) or,
    without one, each language's learning progress."""
    every: int = 10
    """bandit: update the weights every this many steps, from the losses of those steps (ODM
    updates every step; a few steps of a small batch give each language enough tokens to measure)."""
    warmup_steps: int = 20
    """No change before this step: early losses fall for every language and say little (ODM warms
    up 2,000 of its 1B model's steps on the initial weights)."""
    eta: float = 1.0
    """Step size of the exponential update, per nat of loss (bandit) or per bit per byte
    (evaluation). DoReMi uses 1; its authors advise 0.1 when weights collapse (doremi#5)."""
    loss_smoothing: float = 0.5
    """bandit: each language's reward is an exponential moving average of its loss, the old
    value kept with this factor (ODM's α: 0.9 in its code, 0.5 in its 1B runs)."""
    explore: bool = False
    """bandit: mix the target with uniform by EXP3's ε_t = min(1/K, sqrt(ln K / (K·t))), t the
    number of updates (ODM, section 3). Off by default: EXP3 explores because a bandit sees one
    arm's loss per round, while the trainer measures every language it drew (full information,
    Hedge); and with BLOOM's K = 59 languages, ε_t = 1/K (the target exactly uniform) for the
    first K·ln K ≈ 240 updates."""
    smoothing: float = 0.5
    """Each change moves the weights this fraction of the way to the rule's target (1: jump)."""
    min_weight: float = 0.002
    """No language's weight goes below this (every language keeps being trained and measured)."""
    max_weight: float = 0.5
    """No language's weight goes above this."""
    signal: Literal["bpb", "continuation"] = "bpb"
    """evaluation: what each checkpoint's evaluation tells the rule of a language: ``bpb``, its
    held-out bits per byte; ``continuation``, its error rate (1 − ``acc``) on the ``continuation``
    task (eval/tasks/continuation.py: a downstream measure, on the same validation split), which
    the evaluation's ``tasks`` must then include. Either way the rule steers by the drop per
    doubling of the language's tokens seen; a language the task scored over fewer than 20 items
    (training/data/mixture/online.py ``MIN_ITEMS``) gets no push either way."""
    reference: Optional[Location] = None
    """evaluation: another bloomline run's folder (RUN_DIR) whose per-language results are the
    reference, read at equal tokens of each language seen (DoReMi's reference model; a small
    proxy run will do). Its languages, tokenizer and validation data must be this run's."""

    def validate(self) -> None:
        check(self.every >= 1, "every", "must be >= 1")
        check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        check(self.eta > 0 and math.isfinite(self.eta), "eta", "must be > 0")
        check(0 <= self.loss_smoothing < 1, "loss_smoothing", "must be in [0, 1)")
        check(0 < self.smoothing <= 1, "smoothing", "must be in (0, 1]")
        check(0 <= self.min_weight < 1, "min_weight", "must be in [0, 1)")
        check(0 < self.max_weight <= 1, "max_weight", "must be in (0, 1]")
        check(self.min_weight <= self.max_weight, "min_weight", f"must be <= max_weight={self.max_weight}")
        check(
            self.reference is None or self.rule == "evaluation",
            "reference",
            "only the evaluation rule reads a reference run",
        )
        check(
            self.signal == "bpb" or self.rule == "evaluation",
            "signal",
            "only the evaluation rule reads an evaluation signal",
        )
        check(
            self.signal == "bpb" or self.reference is None,
            "signal",
            "a reference run is read by its bpb: the continuation signal steers by progress",
        )

    def check_languages(self, n: int) -> None:
        """Floors and ceilings must admit a blend of ``n`` languages: n·min ≤ 1 ≤ n·max."""
        if n * self.min_weight > 1:
            raise ConfigError(
                "batch.online.min_weight",
                f"{n} languages × min_weight {self.min_weight} = "
                f"{n * self.min_weight:.3g} > 1: no blend has that floor; "
                f"lower it to at most {1 / n:.4g}",
            )
        if n * self.max_weight < 1:
            raise ConfigError(
                "batch.online.max_weight",
                f"{n} languages × max_weight {self.max_weight} = "
                f"{n * self.max_weight:.3g} < 1: no blend has that ceiling; "
                f"raise it to at least {1 / n:.4g}",
            )


MANIFEST_BLEND = {"rule": "alpha", "alpha": "manifest"}
"""What the default rule is recorded as (training/data/mixture/blend.py ``Blend.identity``): the data's
manifest blend, the only one before ``batch.blend`` (checkpoints of format 2 and earlier)."""


@dataclass
class BlendRuleConfig:
    """``batch.blend``: the language weights training starts from, and for ``schedule`` how they
    move with the step (training/data/mixture/blend.py). ``batch.mixture: online`` steers on from them."""

    rule: Literal["alpha", "natural", "weights", "unimax", "schedule"] = "alpha"
    """``alpha``: p ∝ tokens^α (BLOOM's α-sampling); ``natural``: p ∝ tokens; ``weights``: the
    ``weights`` below; ``unimax``: an equal token budget per language, capped at ``max_epochs``
    passes over its data, the rest spread over the others (Chung et al. 2023, UniMax, arXiv
    2304.09151, Algorithm 1); ``schedule``: temperature sampling p ∝ tokens^(1/τ), τ moving from
    ``temperature_start`` to ``temperature_end`` ("Cooldown": Li et al. 2025, arXiv 2410.04579).
    Tokens are each language's training tokens in the data's manifest."""
    alpha: Optional[float] = None
    """``alpha``: the exponent (0: every language alike). None: the manifest's blend as prepared
    (α = 0.3 over the prepared tokens by default, or the prepare recipe's ``blend.weights``)."""
    weights: dict[str, float] = field(default_factory=dict)
    """``weights``: relative weight per language (normalised over the data's languages; a language
    left out gets none)."""
    max_epochs: Optional[float] = None
    """``unimax``: the most passes over one language's training tokens the run's token budget
    (``train.steps`` × ``batch.tokens_per_step``, ramp-up included) may spend on it. Required
    with ``unimax``."""
    temperature_start: float = 5.0
    """``schedule``: τ at step 1 (τ = 1/α: 5 is α = 0.2, far above BLOOM's 0.3 in lifting the tail)."""
    temperature_end: float = 1.0
    """``schedule``: τ from step ``schedule_steps`` on (1: the data's natural proportions)."""
    schedule_steps: Optional[int] = None
    """``schedule``: steps over which τ moves linearly from start to end; None: ``train.steps``."""
    schedule_moves: int = 100
    """``schedule``: how many times τ moves over ``schedule_steps`` (in equal stages, the first at
    ``temperature_start``, the last at ``temperature_end``; at most once a step). Each move is one
    record in ``mixture.jsonl``: a run of 100k steps does not log 100k weight vectors."""

    def validate(self) -> None:
        check(self.alpha is None or 0 <= self.alpha <= 1, "alpha", "must be in [0, 1]")
        check(self.rule != "weights" or bool(self.weights), "weights", "the weights rule needs weights per language")
        for lang, w in self.weights.items():
            check(isinstance(w, (int, float)) and w >= 0 and math.isfinite(w), f"weights.{lang}", "must be >= 0")
        check(
            self.rule != "unimax" or self.max_epochs is not None,
            "max_epochs",
            "unimax needs a cap on epochs per language",
        )
        check(self.max_epochs is None or self.max_epochs > 0, "max_epochs", "must be > 0")
        check(
            self.temperature_start >= 1,
            "temperature_start",
            "must be >= 1 (τ below 1 favours the head even more than the data does)",
        )
        check(self.temperature_end >= 1, "temperature_end", "must be >= 1")
        check(self.schedule_steps is None or self.schedule_steps >= 1, "schedule_steps", "must be >= 1")
        check(self.schedule_moves >= 1, "schedule_moves", "must be >= 1")


@dataclass
class BatchConfig:
    """Dynamic batches: a token budget per step, one length bucket per step."""

    tokens_per_step: int = 2048 * 2048
    """Global token budget of one optimizer step (BLOOM-176B: 2048 samples × 2048 tokens)."""
    micro_batch_tokens: int = 8192
    """Tokens (padded) of one micro-batch on one rank: samples per micro-batch = this // bucket."""
    rampup_start_tokens: Optional[int] = None
    """Batch-size ramp-up: start at this budget (BLOOM: 192 × 2048); None: no ramp-up."""
    rampup_increment_tokens: int = 16 * 2048
    """Ramp-up increment (BLOOM: 16 samples)."""
    rampup_tokens: int = 0
    """Tokens consumed over which the budget grows to tokens_per_step (BLOOM: 20M samples)."""
    lr_scaling: Literal["none", "linear", "sqrt"] = "linear"
    """Scale the LR by the step's actual batch tokens / tokens_per_step (DeepSpeed's
    variable-batch-size-and-LR): linear, square root, or not at all."""
    attn_weight: Optional[float] = None
    """Cost of one attended (query, key) pair, in padded positions, in the cost the sampler
    balances ranks by: padded length + attn_weight·Σ dᵢ(dᵢ+1)/2 over the sample's documents.
    None: the model's FLOPs ratio 12·L·H / 6·N (training/planning/flops.py; bloom-560m 8.8e-5)."""
    balance_tolerance: float = 0.02
    """Data-parallel ranks' cost (above) must be within this of the step's mean."""
    blend: BlendRuleConfig = field(default_factory=BlendRuleConfig)
    """The starting language weights and the rule that sets them (by default the manifest's blend)."""
    mixture: Literal["fixed", "online"] = "fixed"
    """The language blend while training runs: ``fixed`` keeps to ``batch.blend``'s rule (its
    weights, or its schedule's); ``online`` lets ``batch.online``'s rule move them at step
    boundaries (training/data/mixture/controller.py), starting from ``batch.blend``'s."""
    online: OnlineMixtureConfig = field(default_factory=OnlineMixtureConfig)
    """The rule and its settings, with ``mixture: online``."""

    def validate(self) -> None:
        check(self.tokens_per_step >= 1, "tokens_per_step", "must be >= 1")
        check(self.micro_batch_tokens >= 1, "micro_batch_tokens", "must be >= 1")
        check(
            self.rampup_start_tokens is None or 1 <= self.rampup_start_tokens <= self.tokens_per_step,
            "rampup_start_tokens",
            "must be between 1 and tokens_per_step",
        )
        check(self.rampup_increment_tokens >= 1, "rampup_increment_tokens", "must be >= 1")
        check(self.rampup_tokens >= 0, "rampup_tokens", "must be >= 0")
        check(self.attn_weight is None or self.attn_weight >= 0, "attn_weight", "must be >= 0")
        check(0 < self.balance_tolerance < 1, "balance_tolerance", "must be in (0, 1)")
        check(
            not (self.mixture == "online" and self.blend.rule == "schedule"),
            "blend.rule",
            "a schedule moves the weights itself; an online mixture starts from a fixed rule's",
        )
