"""Evaluate a checkpoint per language on the data's validation splits (``bloomline evaluate``).

The model is the checkpoint's whole single-device ``Bloom`` (``training.checkpoint.load_model``,
any layout); one process. Every language with a validation split is evaluated on the same fixed
samples every round (its validation shards in manifest order, up to
``eval.max_tokens_per_lang``), with the training's labels (``training.data.collate``: no token
is predicted across a document boundary, nor the first token of a document). Results are rows of
contract 3 (``eval/results.py``, ``eval/RESULTS.md``).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from bloomline.errors import CheckpointError
from data_prep.tokenizer import token_bytes
from training.config import EvalConfig
from eval.metrics import LangTotals, metric_rows
from data_prep.shards import manifest_path
from training.checkpoint import META_FILE, PRECISIONS, load_model, trained_on
from training.data import ShardIndex, collate, verify_once
from training.layout import layout_label
from training.model import IGNORE_INDEX, Bloom


@dataclass
class Evaluation:
    rows: list[dict[str, Any]]
    """Metric rows (eval.metrics.metric_rows) with the checkpoint's identity added."""
    generations: list[dict[str, Any]]
    seconds: float
    tokens: int


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
def evaluate_model(model: Bloom, index: ShardIndex, cfg: EvalConfig, token_bytes_: np.ndarray, eos_id: int,
                   progress: Callable[[str], None] = lambda msg: None) -> dict[str, LangTotals]:
    """Σ NLL, tokens, bytes and documents per language of ``index``'s split."""
    nbytes = torch.from_numpy(token_bytes_)
    out: dict[str, LangTotals] = {}
    for lang in index.languages:
        t = out.setdefault(lang, LangTotals())
        for bucket, refs in language_samples(index, lang, cfg.max_tokens_per_lang):
            m = max(1, cfg.batch_tokens // bucket)
            for i in range(0, len(refs), m):
                b = collate(index, refs[i:i + m], bucket, index.pad_id)
                logits = model(b["input_ids"], b["segment_ids"])
                mask = b["labels"] != IGNORE_INDEX
                # per-token NLL in fp32, as the training loss computes it (a bf16 log-softmax over the
                # vocabulary is too coarse), then the predicted positions
                nll = F.cross_entropy(logits.float().flatten(0, 1), torch.where(mask, b["labels"], 0).flatten(),
                                      reduction="none")[mask.flatten()]
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


@torch.no_grad()
def greedy(model: Bloom, prompt: list[int], new_tokens: int, eos_id: int) -> list[int]:
    """Greedy continuation of ``prompt`` (one document), stopping at </s>."""
    ids = list(prompt)
    vocab = model.cfg.vocab_size
    for _ in range(new_tokens):
        nxt = int(model(torch.tensor([ids]))[0, -1, :vocab].argmax())
        if nxt == eos_id:
            break
        ids.append(nxt)
    return ids[len(prompt):]


def generations(model: Bloom, index: ShardIndex, cfg: EvalConfig, decode: Callable[[list[int]], str],
                eos_id: int) -> list[dict[str, Any]]:
    """``cfg.prompts_per_lang`` greedy generations per language, from the first ``cfg.prompt_tokens``
    tokens of its first validation documents (fixed, so rounds compare)."""
    out = []
    for lang in index.languages:
        prompts: list[list[int]] = []
        for _, refs in language_samples(index, lang, None):
            for sid, row in refs:
                toks, offsets = index.fetch(sid, row)
                for start in offsets.tolist():
                    doc = toks[start:start + cfg.prompt_tokens].tolist()
                    if len(doc) == cfg.prompt_tokens and eos_id not in doc and len(prompts) < cfg.prompts_per_lang:
                        prompts.append(doc)
            if len(prompts) >= cfg.prompts_per_lang:
                break
        for k, p in enumerate(prompts):
            out.append({"lang": lang, "k": k, "prompt": decode(p), "completion": decode(greedy(model, p, cfg.new_tokens, eos_id))})
    return out


def evaluate(ckpt_dir: str | Path, data_dir: str | Path, cfg: EvalConfig, run: str,
             stamp: Optional[Path] = None, progress: Callable[[str], None] = lambda msg: None) -> Evaluation:
    """Evaluate the checkpoint ``ckpt_dir`` on ``data_dir``'s validation splits."""
    import sentencepiece as spm

    t0 = time.perf_counter()
    ckpt_dir, data_dir = Path(ckpt_dir), Path(data_dir)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, meta = load_model(ckpt_dir, PRECISIONS[cfg.precision])
    if not trained_on(meta, data_dir):
        raise CheckpointError(f"{ckpt_dir / META_FILE}: field 'data_manifest_sha256' is not the sha256 of "
                              f"{manifest_path(data_dir)}: the checkpoint was trained on other data; evaluate it "
                              f"with the --data it was trained on")
    index = ShardIndex(data_dir, "valid")
    if stamp is not None:
        verify_once(index, stamp)
    tok = index.manifest["tokenizer"]
    model_file = data_dir / tok["path"]
    eos = int(tok["eos_id"])
    per_lang = evaluate_model(model, index, cfg, token_bytes(model_file), eos, progress)
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    gens = generations(model, index, cfg, sp.decode, eos) if cfg.prompts_per_lang and cfg.new_tokens else []
    now = dt.datetime.now(dt.timezone.utc)
    ident = {"run": run, "step": int(meta["step"]), "checkpoint": str(ckpt_dir.resolve()), "precision": cfg.precision,
             "layout": layout_label(meta["layout"]), "data_manifest_sha256": meta["data_manifest_sha256"], "evaluated_at": now}
    rows = [{**ident, **r} for r in metric_rows(per_lang, meta["sampler"]["tokens_by_lang"])]
    gens = [{**{k: ident[k] for k in ("run", "step", "precision", "evaluated_at")}, **g} for g in gens]
    return Evaluation(rows, gens, time.perf_counter() - t0, sum(t.tokens for t in per_lang.values()))
