"""Typed configuration of ``bloomline evaluate`` (recipes in ``configs/eval/``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from bloomline.config import check


@dataclass
class EvalConfig:
    precision: Literal["fp32", "bf16"] = "fp32"
    """Dtype the checkpoint's model is evaluated in (recorded with every result row)."""
    max_tokens_per_lang: Optional[int] = None
    """Evaluate at most this many tokens of each language's validation split (its first samples
    in shard order, the same every round); None: all of it."""
    batch_tokens: int = 16384
    """Padded tokens per forward pass (samples of one bucket are batched together)."""
    prompts_per_lang: int = 2
    """Greedy generations stored per language, from fixed prompts (the first validation documents)."""
    prompt_tokens: int = 16
    """Tokens of each prompt."""
    new_tokens: int = 24
    """Tokens generated per prompt (greedy)."""
    threads: Optional[int] = None
    """torch threads for the evaluation; None: torch's default (all cores)."""
    regression_threshold: float = 0.02
    """A language whose bits per byte rose by more than this since the previous checkpoint is flagged."""

    def validate(self) -> None:
        check(self.max_tokens_per_lang is None or self.max_tokens_per_lang >= 1, "max_tokens_per_lang", "must be >= 1")
        check(self.batch_tokens >= 1, "batch_tokens", "must be >= 1")
        check(self.prompts_per_lang >= 0, "prompts_per_lang", "must be >= 0")
        check(self.prompt_tokens >= 1, "prompt_tokens", "must be >= 1")
        check(self.new_tokens >= 0, "new_tokens", "must be >= 0")
        check(self.threads is None or self.threads >= 1, "threads", "must be >= 1")
        check(self.regression_threshold >= 0, "regression_threshold", "must be >= 0")
