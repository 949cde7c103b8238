"""``continuation``: which of four endings continues a text, for any language of the data,
code included, with no data beyond the corpus's own validation split.

Items, the same every round: each language's validation documents in stream order (bucket, then
shard, then row; a document a sample starts with a piece of counts as that piece), cut into
windows of ``CONTEXT + LENGTH`` tokens at positions 0, 48, 96, ... Item *i* is window *i*'s
first ``CONTEXT`` tokens (the context) and its next ``LENGTH`` tokens (the true continuation).
The three distractors are the tokens at the same position, of the same length, of the next
documents (cyclically) that reach that far; where the language has fewer such documents, the
endings of the next windows at other positions (same length); never one equal to the true
ending or to another distractor. The true ending is placed at position *i* mod 4. A language
with fewer than four windows is skipped, with the reason.

Scored as lm-eval scores a multiple-choice task: each ending's log-likelihood given the context
(the sum over its tokens of log p). ``acc``: the ending with the highest log-likelihood is the
true one; ``acc_bytes``: the highest log-likelihood per UTF-8 byte of the ending (lm-eval's
``acc_bytes``: per-character normalisation, ``acc_norm``, is unfair across scripts, lm-eval
#3278). Chance is 1/4 for both. Standard error: sqrt(p(1−p)/(n−1)).
"""

from __future__ import annotations

import numpy as np
import torch

from eval.model import EvalModel
from eval.tasks.base import Context, Row, Task, proportion, skipped, with_means
from training.model.bloom import IGNORE_INDEX

CONTEXT = 32
"""Context tokens of an item."""
LENGTH = 16
"""Tokens of each ending."""
CHOICES = 4
ITEMS = 100
"""Items per language unless the task's ``limit`` says otherwise."""


def documents(ctx: Context, lang: str, need: int, at_most: int) -> list[np.ndarray]:
    """Up to ``at_most`` validation documents of ``lang`` with at least ``need`` tokens (their
    ``</s>`` left out), in stream order."""
    from eval.tasks.validation import language_samples

    docs: list[np.ndarray] = []
    for _, refs in language_samples(ctx.index, lang, None):
        for sid, row in refs:
            toks, offsets = ctx.index.fetch(sid, row)
            bounds = [*offsets.tolist(), len(toks)]
            for a, b in zip(bounds, bounds[1:]):
                doc = toks[a:b]
                if len(doc) and doc[-1] == ctx.eos_id:
                    doc = doc[:-1]
                if len(doc) >= need:
                    docs.append(np.asarray(doc))
                    if len(docs) >= at_most:
                        return docs
    return docs


def items(docs: list[np.ndarray], n: int) -> list[tuple[np.ndarray, list[np.ndarray], int]]:
    """(context, endings, index of the true one) of up to ``n`` items (module docstring)."""
    width = CONTEXT + LENGTH
    windows = [(d, p) for d, doc in enumerate(docs) for p in range(0, len(doc) - width + 1, width)]
    out = []
    for i, (d, p) in enumerate(windows[:n]):
        context, true = docs[d][p : p + CONTEXT], docs[d][p + CONTEXT : p + width]
        same_place = [docs[(d + k) % len(docs)] for k in range(1, len(docs))]
        candidates = [x[p + CONTEXT : p + width] for x in same_place if len(x) >= p + width]
        candidates += [
            docs[e][q + CONTEXT : q + width]
            for e, q in (windows[(i + k) % len(windows)] for k in range(1, len(windows)))
        ]
        others: list[np.ndarray] = []
        for cand in candidates:
            if not np.array_equal(cand, true) and not any(np.array_equal(cand, o) for o in others):
                others.append(cand)
            if len(others) == CHOICES - 1:
                break
        if len(others) < CHOICES - 1:
            continue
        answer = i % CHOICES
        out.append((context, others[:answer] + [true] + others[answer:], answer))
    return out


BATCH = 16
"""Items scored in one forward pass (their 4 endings each)."""


def loglikelihoods(model: EvalModel, context: np.ndarray, endings: list[np.ndarray]) -> list[float]:
    """log p(ending | context) of each ending, summed over its tokens (fp32 log-softmax)."""
    return batch_loglikelihoods(model, [(context, endings)])[0]


def batch_loglikelihoods(model: EvalModel, batch: list[tuple[np.ndarray, list[np.ndarray]]]) -> list[list[float]]:
    """:func:`loglikelihoods` of several items (contexts of one length, endings of one length) in one pass."""
    c = len(batch[0][0])
    ids = torch.tensor(
        np.stack([np.concatenate([context, e]) for context, endings in batch for e in endings]), dtype=torch.long
    )
    targets = torch.full_like(ids, IGNORE_INDEX)
    targets[:, c - 1 : -1] = ids[:, c:]  # the predictions of the endings' tokens
    ll = model.token_logprobs(ids, torch.ones_like(ids), targets).sum(-1).tolist()
    k = len(batch[0][1])
    return [ll[i * k : (i + 1) * k] for i in range(len(batch))]


def score(
    model: EvalModel, token_bytes: np.ndarray, its: list[tuple[np.ndarray, list[np.ndarray], int]]
) -> tuple[int, int]:
    """(items right by log-likelihood, items right by log-likelihood per byte)."""
    right = right_bytes = 0
    for i in range(0, len(its), BATCH):
        chunk = its[i : i + BATCH]
        for (_, endings, answer), ll in zip(chunk, batch_loglikelihoods(model, [(c, e) for c, e, _ in chunk])):
            per_byte = [v / max(int(token_bytes[e].sum()), 1) for v, e in zip(ll, endings)]
            right += int(np.argmax(ll)) == answer
            right_bytes += int(np.argmax(per_byte)) == answer
    return right, right_bytes


class Continuation(Task):
    name = "continuation"
    chance = {"acc": 1 / CHOICES, "acc_bytes": 1 / CHOICES}

    def run(self, ctx: Context) -> list[Row]:
        n = ctx.spec.limit or ITEMS
        rows: list[Row] = []
        for lang in ctx.languages(ctx.index.languages):
            # (a few documents more than items, for the distractors of the last ones)
            its = items(documents(ctx, lang, CONTEXT + LENGTH, n + CHOICES), n)
            if len(its) < 1:
                rows.append(
                    skipped(
                        lang, f"fewer than {CHOICES} windows of {CONTEXT + LENGTH} tokens in its validation documents"
                    )
                )
                continue
            right, right_bytes = score(ctx.model, ctx.token_bytes, its)
            for metric, k in (("acc", right), ("acc_bytes", right_bytes)):
                p, se = proportion(k, len(its))
                rows.append(Row(lang, metric, p, se, len(its)))
            ctx.progress(f"continuation {lang}: acc {right / len(its):.3f} over {len(its)} items")
        return with_means(rows)
