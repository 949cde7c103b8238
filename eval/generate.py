"""Greedy decoding with the checkpoint's single-device model (the evaluation's generations, and
the translations of the ``flores`` task)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from training.model.bloom import Bloom


@torch.no_grad()
def greedy(
    model: Bloom, prompt: list[int], new_tokens: int, eos_id: int, stop: Optional[Callable[[list[int]], bool]] = None
) -> list[int]:
    """Greedy continuation of ``prompt``: at most ``new_tokens``, ending at </s> (left out) or as
    soon as ``stop(tokens so far)`` holds. No key-value cache: every step runs the whole sequence,
    which at evaluation sizes (tens of tokens, a small model on CPU) costs less than keeping one."""
    ids = list(prompt)
    vocab = model.cfg.vocab_size
    for _ in range(new_tokens):
        nxt = int(model(torch.tensor([ids]))[0, -1, :vocab].argmax())
        if nxt == eos_id:
            break
        ids.append(nxt)
        if stop is not None and stop(ids[len(prompt) :]):
            break
    return ids[len(prompt) :]
