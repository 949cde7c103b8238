"""Greedy decoding (the evaluation's generations, and the translations of the ``flores`` task).

:func:`generate` decodes a batch of prompts through an :class:`~eval.model.EvalModel`'s
key-value cache: each new token runs one position through the model, where :func:`greedy`, the
cache-free reference kept for tests and the benchmark, runs the whole sequence again for every
token. Prompts of different lengths are left-padded with segment id 0: padding is masked out of
attention (training/model/bloom.py ``attention_bias``) and ALiBi depends only on the distance
between positions, so a prompt's tokens are the ones it gets alone.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from training.model.bloom import Bloom

BATCH = 16
"""Prompts decoded together."""


@torch.no_grad()
def generate(
    model: "EvalModel",  # noqa: F821 (eval.model; a string, so this module needs no import of it)
    prompts: list[list[int]],
    new_tokens: int,
    eos_id: int,
    stop: Optional[Callable[[list[int]], bool]] = None,
) -> list[list[int]]:
    """Each prompt's greedy continuation: at most ``new_tokens``, ending at </s> (left out) or as
    soon as ``stop(its tokens so far)`` holds; in the order of ``prompts``."""
    out: list[list[int]] = []
    for i in range(0, len(prompts), BATCH):
        out += _generate(model, prompts[i : i + BATCH], new_tokens, eos_id, stop)
    return out


def _generate(
    model: "EvalModel",  # noqa: F821
    prompts: list[list[int]],
    new_tokens: int,
    eos_id: int,
    stop: Optional[Callable[[list[int]], bool]],
) -> list[list[int]]:
    outs: list[list[int]] = [[] for _ in prompts]
    if new_tokens <= 0 or not prompts:
        return outs
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    seg = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        seg[b, width - len(p) :] = 1
    live = [True] * len(prompts)
    try:
        nxt = model.start(ids, seg)
        for n in range(new_tokens):
            for b, tok in enumerate(nxt.tolist()):
                if not live[b]:
                    continue
                if tok == eos_id:
                    live[b] = False
                    continue
                outs[b].append(tok)
                if stop is not None and stop(outs[b]):
                    live[b] = False
            if not any(live) or n == new_tokens - 1:
                break
            nxt = model.step(nxt)  # a finished prompt's row runs on, unread: cheaper than reshaping the caches
    finally:
        model.end()
    return outs


@torch.no_grad()
def greedy(
    model: Bloom, prompt: list[int], new_tokens: int, eos_id: int, stop: Optional[Callable[[list[int]], bool]] = None
) -> list[int]:
    """The cache-free reference of :func:`generate` for one prompt on a single-device ``Bloom``:
    every step runs the whole sequence."""
    ids = list(prompt)
    vocab = model.cfg.vocab_size
    device = next(model.parameters()).device
    for _ in range(new_tokens):
        nxt = int(model(torch.tensor([ids], device=device))[0, -1, :vocab].argmax())
        if nxt == eos_id:
            break
        ids.append(nxt)
        if stop is not None and stop(ids[len(prompt) :]):
            break
    return ids[len(prompt) :]
