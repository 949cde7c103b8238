"""The validation task, which every evaluation runs: per language, the loss, perplexity and bits
per byte of the data's own validation split (definitions in eval/RESULTS.md and eval/results/metrics.py).

Every language with a validation split is evaluated on the same fixed samples every round (its
validation shards in manifest order, up to ``max_tokens_per_lang``), with the training's labels
(``training.data.shard_reader.collate``: no token is predicted across a document boundary, nor the first token
of a document). Rows: ``loss``, ``ppl``, ``bpb`` and the counts ``tokens``, ``bytes``, ``docs``
per language, and per BLOOM group and overall both token-weighted and as the mean of languages.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from eval.model import EvalModel
from eval.results.metrics import LangTotals, metric_rows
from eval.results.rows import VALIDATION, VALIDATION_METRICS
from eval.tasks.base import Context, Row, Task
from training.config import EvalConfig
from training.data.shard_reader import ShardIndex, collate
from training.model.bloom import IGNORE_INDEX


def language_samples(index: ShardIndex, lang: str, cap: Optional[int]) -> list[tuple[int, list[tuple[int, int]]]]:
    """(bucket, samples) of one language in stream order (bucket, then shard, then row), up to
    ``cap`` real tokens: the same samples every round."""
    out, total = [], 0
    for (lg, bucket), stream in index.streams.items():
        if lg != lang:
            continue
        sids, rows = stream.locate(np.arange(stream.size))
        lengths = index.lengths(sids, rows)
        refs = []
        for sid, row, n in zip(sids.tolist(), rows.tolist(), lengths.tolist()):
            if cap is not None and total >= cap:
                break
            refs.append((sid, row))
            total += n
        if refs:
            out.append((bucket, refs))
    return out


@torch.no_grad()
def evaluate_model(
    model: EvalModel,
    index: ShardIndex,
    cfg: EvalConfig,
    token_bytes_: np.ndarray,
    eos_id: int,
    progress: Callable[[str], None] = lambda msg: None,
) -> dict[str, LangTotals]:
    """Σ NLL, tokens, bytes and documents per language of ``index``'s split."""
    nbytes = torch.from_numpy(token_bytes_)
    out: dict[str, LangTotals] = {}
    for lang in index.languages:
        t = out.setdefault(lang, LangTotals())
        for bucket, refs in language_samples(index, lang, cfg.max_tokens_per_lang):
            m = max(1, cfg.batch_tokens // bucket)
            for i in range(0, len(refs), m):
                b = collate(index, refs[i : i + m], bucket, index.pad_id)
                mask = b["labels"] != IGNORE_INDEX
                # per-token NLL in fp32, as the training loss computes it (eval/model.py), of the predicted positions
                nll = -model.token_logprobs(b["input_ids"], b["segment_ids"], b["labels"])[mask]
                labels = b["labels"][mask]
                text = nbytes[labels] > 0
                t.nll += float(nll.sum())
                t.tokens += int(labels.numel())
                t.text_nll += float(nll[text].sum())
                t.bytes += int(nbytes[labels].sum())
                real = torch.arange(bucket)[None, :] < b["lengths"][:, None]
                t.docs += int(((b["input_ids"] == eos_id) & real).sum())
        progress(f"{lang}: {t.tokens:,} tokens, bits per byte {t.bpb:.4f}")
    return out


class Validation(Task):
    name = VALIDATION

    def run(self, ctx: Context) -> list[Row]:
        per_lang = evaluate_model(ctx.model, ctx.index, ctx.settings, ctx.token_bytes, ctx.eos_id, ctx.progress)
        self.tokens = sum(t.tokens for t in per_lang.values())
        return [
            Row(
                r["lang"],
                m,
                None if r[m] is None else float(r[m]),
                n=r["tokens"],
                scope=r["scope"],
                weighting=r["weighting"],
            )
            for r in metric_rows(per_lang, {})
            for m in VALIDATION_METRICS
        ]
