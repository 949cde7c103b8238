"""Evaluate a checkpoint per language (``bloomline evaluate``): the validation task (loss,
perplexity, bits per byte of the data's validation split) and every task of ``tasks``
(eval/tasks/), plus a few greedy generations.

The model is the checkpoint's whole single-device ``Bloom`` (``training.checkpoint.load.load_model``,
any layout); one process. Results are rows of contract 3, version 2 (``eval/results.py``,
``eval/RESULTS.md``): one per (task, scope, language, weighting, metric), with the checkpoint's
identity and the training tokens of the language it had seen.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from bloomline.errors import CheckpointError, ConfigError
from data_prep.shards import load_manifest, manifest_path
from data_prep.tokenizer import token_bytes
from eval.generate import greedy
from eval.metrics import GROUPS, group_of
from eval.tasks import make, validation_spec
from eval.tasks.base import Context
from eval.tasks.validation import language_samples
from training.checkpoint.load import load_model
from training.checkpoint.meta import PRECISIONS, trained_on
from training.checkpoint.run_dir import META_FILE
from training.config import EvalConfig
from training.data.shard_reader import ShardIndex, verify_once
from training.model.bloom import Bloom
from training.parallel.layout import layout_label


@dataclass
class Evaluation:
    rows: list[dict[str, Any]]
    """Result rows (contract 3, version 2) with the checkpoint's identity added."""
    generations: list[dict[str, Any]]
    seconds: float
    tokens: int
    """Validation tokens evaluated."""
    task_seconds: dict[str, float]
    """Seconds each task took."""

    def validation(self) -> list[dict[str, Any]]:
        """The validation task's rows in wide form (eval/results.py validation_rows)."""
        import pyarrow as pa

        from eval.results import SCHEMA, validation_rows

        return validation_rows(pa.Table.from_pylist(self.rows, schema=SCHEMA))


def generations(
    model: Bloom, index: ShardIndex, cfg: EvalConfig, decode: Callable[[list[int]], str], eos_id: int
) -> list[dict[str, Any]]:
    """``cfg.prompts_per_lang`` greedy generations per language, from the first ``cfg.prompt_tokens``
    tokens of its first validation documents (fixed, so rounds compare)."""
    out = []
    for lang in index.languages:
        prompts: list[list[int]] = []
        for _, refs in language_samples(index, lang, None):
            for sid, row in refs:
                toks, offsets = index.fetch(sid, row)
                for start in offsets.tolist():
                    doc = toks[start : start + cfg.prompt_tokens].tolist()
                    if len(doc) == cfg.prompt_tokens and eos_id not in doc and len(prompts) < cfg.prompts_per_lang:
                        prompts.append(doc)
            if len(prompts) >= cfg.prompts_per_lang:
                break
        for k, p in enumerate(prompts):
            out.append(
                {
                    "lang": lang,
                    "k": k,
                    "prompt": decode(p),
                    "completion": decode(greedy(model, p, cfg.new_tokens, eos_id)),
                }
            )
    return out


def seen(scope: str, lang: str, tokens_seen: dict[str, int], langs: list[str]) -> int:
    """Training tokens the checkpoint had consumed of a row's language, or summed over its group or all."""
    if scope == "language":
        return int(tokens_seen.get(lang, 0))
    members = [l for l in langs if scope == "overall" or (lang in GROUPS and group_of(l) == lang)]
    return int(sum(tokens_seen.get(l, 0) for l in members))


def heldout_data(data_dir: Path, cfg: EvalConfig) -> Path:
    """The data whose validation split is evaluated: the training data's, or ``cfg.heldout`` when
    its tokenizer is the training data's (the same pieces: the same sha256)."""
    if not cfg.heldout:
        return data_dir
    other = Path(cfg.heldout)
    mine, theirs = (load_manifest(d)["tokenizer"] for d in (data_dir, other))
    if mine.get("sha256") != theirs.get("sha256"):
        raise ConfigError(
            "heldout",
            f"{manifest_path(other)} was tokenized with another tokenizer than {manifest_path(data_dir)}; "
            f"prepare it with -o tokenizer.model={data_dir / mine['path']}",
        )
    return other


def evaluate(
    ckpt_dir: str | Path,
    data_dir: str | Path,
    cfg: EvalConfig,
    run: str,
    stamp: Optional[Path] = None,
    progress: Callable[[str], None] = lambda msg: None,
) -> Evaluation:
    """Evaluate the checkpoint ``ckpt_dir`` on ``data_dir``'s validation splits and ``cfg.tasks``."""
    import sentencepiece as spm

    t0 = time.perf_counter()
    ckpt_dir, data_dir = Path(ckpt_dir), Path(data_dir)
    tasks = [(spec, make(spec)) for spec in [validation_spec(), *cfg.tasks]]  # an unknown task: refused before loading
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, meta = load_model(ckpt_dir, PRECISIONS[cfg.precision])
    if not trained_on(meta, data_dir):
        raise CheckpointError(
            f"{ckpt_dir / META_FILE}: field 'data_manifest_sha256' is not the sha256 of "
            f"{manifest_path(data_dir)}: the checkpoint was trained on other data; evaluate it "
            f"with the --data it was trained on"
        )
    index = ShardIndex(heldout_data(data_dir, cfg), "valid")
    if stamp is not None:
        verify_once(index, stamp)
    tok = index.manifest["tokenizer"]
    model_file = data_dir / tok["path"]
    eos = int(tok["eos_id"])
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    tokens_seen = meta["sampler"]["tokens_by_lang"]
    base = dict(
        model=model.eval(),
        tokenizer=sp,
        index=index,
        token_bytes=token_bytes(model_file),
        tokenizer_file=model_file,
        eos_id=eos,
        settings=cfg,
        tokens_seen=tokens_seen,
        progress=progress,
    )
    rows, seconds, tokens = [], {}, 0
    for spec, task in tasks:
        t = time.perf_counter()
        rows += [r.to_dict(task.name) for r in task.run(Context(spec=spec, **base))]
        seconds[task.name] = seconds.get(task.name, 0.0) + time.perf_counter() - t
        tokens += getattr(task, "tokens", 0)
    gens = generations(model, index, cfg, sp.decode, eos) if cfg.prompts_per_lang and cfg.new_tokens else []
    now = dt.datetime.now(dt.timezone.utc)
    ident = {
        "run": run,
        "step": int(meta["step"]),
        "checkpoint": str(ckpt_dir.resolve()),
        "precision": cfg.precision,
        "layout": layout_label(meta["layout"]),
        "data_manifest_sha256": meta["data_manifest_sha256"],
        "evaluated_at": now,
    }
    train: dict[str, int] = {}  # each language's training tokens: epochs seen = tokens seen ÷ these
    for sh in load_manifest(data_dir)["shards"]:
        if sh["split"] == "train":
            train[sh["lang"]] = train.get(sh["lang"], 0) + int(sh["tokens"])

    def companions(r: dict[str, Any]) -> dict[str, Any]:
        n, of = (seen(r["scope"], r["lang"], t, index.languages) for t in (tokens_seen, train))
        return {"tokens_seen": n, "epochs_seen": n / of if of else None}

    rows = [{**ident, **r, **companions(r)} for r in rows]
    gens = [{**{k: ident[k] for k in ("run", "step", "precision", "evaluated_at")}, **g} for g in gens]
    return Evaluation(rows, gens, time.perf_counter() - t0, tokens, seconds)
