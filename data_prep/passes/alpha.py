"""α-sampling: language weights p ∝ (tokens share)^α (BLOOM, after XLM/mT5), one formula read by
the tokenizer's sample, the manifest's blend and training's blend rules (training/data/mixture/blend.py).
A file of its own so that training's code digest does not follow the tokenizer's trainer."""

from __future__ import annotations


def alpha_weights(sizes: dict[str, float], alpha: float) -> dict[str, float]:
    """p_i ∝ (n_i / Σn)^alpha, normalized (alpha=1: proportional; →0: uniform)."""
    total = sum(sizes.values())
    if total <= 0:
        return {}
    raw = {k: (v / total) ** alpha for k, v in sizes.items() if v > 0}
    z = sum(raw.values())
    return {k: v / z for k, v in sorted(raw.items())}
