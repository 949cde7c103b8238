"""Checkpoints made without training: a model's weights written as the files DeepSpeed writes for one
rank at ZeRO 0, with the ``bloomline.json`` a run at step 1 would give them (training/CHECKPOINT.md),
so that evaluation, export and loading can be tested on known weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from bloomline.io import sha256_file
from training.checkpoint.meta import make_meta
from training.config import TrainRecipe


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
