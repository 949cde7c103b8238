"""Checkpoints made without training, so that evaluation, export, loading and resharding can be
tested on known weights: :func:`one_rank_checkpoint`, a model's weights as the files DeepSpeed
writes for one rank at ZeRO 0, with the ``bloomline.json`` a run at step 1 would give them
(training/CHECKPOINT.md); :func:`write_checkpoint`, the same for any TP × PP layout at a given step
(tests/training/checkpoint/test_checkpoint.py, the CLI's tests); and :class:`Planted`, a pickle that
runs code when loaded unsafely, for the tests that check every loader refuses it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from bloomline.io import sha256_file
from training.checkpoint.meta import make_meta
from training.config import TrainRecipe
from training.model.bloom import Bloom
from training.parallel.layout import pipeline_prefixes, tp_slice


def one_rank_checkpoint(step: Path, state: dict[str, torch.Tensor], recipe: TrainRecipe, data: Path) -> Path:
    """``step`` (created) as a 1-rank checkpoint holding ``state``, trained by ``recipe`` on the
    prepared ``data`` as far as step 1, with nothing seen yet."""
    step.mkdir(parents=True)
    torch.save({"module": state}, step / "mp_rank_00_model_states.pt")
    sampler = {"version": 2, "seed": 1, "step": 1, "consumed_tokens": 0, "tokens_by_lang": {}, "streams": {}}
    counters = {"skipped": 0, "fp16_overflows": 0, "skipped_in_a_row": 0, "loss_ema": None}
    meta = make_meta(1, recipe, data, sha256_file(data / "manifest.json"), sampler, counters)
    (step / "bloomline.json").write_text(json.dumps(meta))
    return step


def write_checkpoint(step_dir: Path, r: TrainRecipe, model: Bloom, step: int = 4) -> dict:
    """The files DeepSpeed writes for r's layout at ZeRO 0 (module weights only), and bloomline.json."""
    step_dir.mkdir(parents=True, exist_ok=True)
    tp, pp, L = r.parallel.tp, r.parallel.pp, r.model.num_layers
    rows = r.model.padded_vocab(tp)
    for rank in range(tp):
        sd = {n: tp_slice(n, p.detach(), rank, tp, rows).clone() for n, p in model.named_parameters()}
        if pp == 1:
            torch.save({"module": sd}, step_dir / f"mp_rank_{rank:02d}_model_states.pt")
            continue
        for i, prefix in enumerate(pipeline_prefixes(L)[:-1]):
            layer = {k[len(prefix) + 1 :]: v for k, v in sd.items() if k.startswith(prefix + ".")}
            torch.save(layer, step_dir / f"layer_{i:02d}-model_{rank:02d}-model_states.pt")
    for mp in range(tp * pp if pp > 1 else 0):
        torch.save({"module": None}, step_dir / f"mp_rank_{mp:02d}_model_states.pt")
    sampler = {
        "version": 2,
        "seed": r.train.seed,
        "step": step,
        "consumed_tokens": 0,
        "tokens_by_lang": {},
        "streams": {},
    }
    meta = make_meta(
        step,
        r,
        step_dir.parent,
        "a" * 64,
        sampler,
        {"skipped": 0, "fp16_overflows": 0, "skipped_in_a_row": 0, "loss_ema": None},
    )
    (step_dir / "bloomline.json").write_text(json.dumps(meta))
    return meta


class Planted:
    """A pickled callable: loading it with weights_only=False runs ``touch`` on the marker."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
