"""A checkpoint's ``bloomline.json`` (contract 2, training/CHECKPOINT.md): written by
:func:`make_meta`, read by :func:`read_meta`, which checks its version and fields at load time
with messages that name the file and the field; the recipe and model it was saved with."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Optional

import torch

import bloomline
from bloomline.config import from_dict, to_dict
from bloomline.errors import CheckpointError, ConfigError
from bloomline.io import read_contract_json
from bloomline.secrets import mask_tree
from bloomline.storage import absolute
from training.checkpoint.run_dir import _TAG, META_FILE, step_of_dir_name
from training.config import ModelConfig, TrainRecipe
from training.config.batch import MANIFEST_BLEND
from training.parallel.layout import (
    LAYOUT_KEYS,
    layout_of,
    tp_rules,
)

FORMAT_VERSION = 5  # 5: the weights it started from (``init_from``); 4: each file's size and sha256 (``files``);
# 3: the blend rule (``blend``); 2: the online mixture's state
READS_VERSIONS = (1, 2, 3, 4, 5)
"""Version 1 files read as a fixed mixture, versions 1 and 2 as the manifest's blend, versions
1-3 with no record of their files (checked for safety only, training/checkpoint/integrity.py)."""
PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def trained_on(meta: dict[str, Any], data_dir: str | Path) -> bool:
    """Whether the checkpoint of ``meta`` (its bloomline.json) was trained on the data in ``data_dir``."""
    from data_prep.storage.shards import manifest_sha256

    return meta["data_manifest_sha256"] == manifest_sha256(data_dir)


def check_trained_on(meta: dict[str, Any], data_dir: Path, step_dir: Path, then: str) -> None:
    """CheckpointError in one line, ending with ``then`` (what to do), unless the checkpoint of
    ``meta`` in ``step_dir`` was trained on the data in ``data_dir``."""
    from data_prep.storage.shards import manifest_path

    if not trained_on(meta, data_dir):
        raise CheckpointError(
            f"{step_dir / META_FILE}: field 'data_manifest_sha256' is not the sha256 of {manifest_path(data_dir)}: {then}"
        )


def make_meta(
    step: int,
    recipe: TrainRecipe,
    data_dir: str | Path,
    data_manifest_sha256: str,
    sampler: dict[str, Any],
    trainer: dict[str, Any],
    mixture: Optional[dict[str, Any]] = None,
    blend: Optional[dict[str, Any]] = None,
    files: Optional[dict[str, dict[str, Any]]] = None,
    init_from: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """The bloomline.json of a checkpoint (fields in training/CHECKPOINT.md); ``files``: the
    folder's files as training/checkpoint/integrity.py ``file_records`` gives them; ``init_from``:
    the weights the run started from (training/hf/from_hf.py ``Source.record``), None
    for the seed's."""
    from training.model.bloom import full_shapes

    assert isinstance(recipe.model, ModelConfig)
    return {
        "format_version": FORMAT_VERSION,
        "written_by": f"bloomline {bloomline.__version__}",
        "step": step,
        "layout": layout_of(recipe.parallel),
        "precision": recipe.train.precision,
        "model": to_dict(recipe.model),
        "data_dir": absolute(data_dir),
        "data_manifest_sha256": data_manifest_sha256,
        "sampler": sampler,
        "tp_rules": tp_rules(list(full_shapes(recipe.model))),
        "trainer": trainer,
        "mixture": mixture,
        "blend": blend if blend is not None else dict(MANIFEST_BLEND),
        "recipe": mask_tree(to_dict(recipe)),
        "files": files,
        "init_from": init_from,
    }


TRAINER_KEYS = ("skipped", "fp16_overflows", "skipped_in_a_row", "loss_ema")
SAMPLER_KEYS = ("version", "seed", "step", "consumed_tokens", "tokens_by_lang", "streams")
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format_version": int,
    "step": int,
    "layout": dict,
    "precision": str,
    "model": dict,
    "data_dir": str,
    "data_manifest_sha256": str,
    "sampler": dict,
    "tp_rules": dict,
    "trainer": dict,
    "blend": dict,
    "recipe": dict,
}


def read_meta(step_dir: str | Path) -> dict[str, Any]:
    """Read and check ``step_dir/bloomline.json``; CheckpointError naming the file and field."""
    step_dir = Path(step_dir)
    path = step_dir / META_FILE
    meta = read_contract_json(
        path, CheckpointError, f"is {step_dir} a complete bloomline checkpoint (RUN_DIR/checkpoints/step_N)?"
    )
    _check_version(path, meta)
    _check_later_fields(path, meta)
    _check_fields(path, step_dir, meta)
    _check_model(path, meta)
    return meta


def _check_version(path: Path, meta: Any) -> None:
    """``meta`` is a dict of a format version this bloomline reads."""
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise CheckpointError(f"{path}: no field 'format_version' (written by a bloomline before checkpoint format 1?)")
    if meta["format_version"] not in READS_VERSIONS:
        raise CheckpointError(
            f"{path}: field 'format_version' is {meta['format_version']!r}, this bloomline reads "
            f"{' and '.join(map(str, READS_VERSIONS))}"
        )


def _check_later_fields(path: Path, meta: dict[str, Any]) -> None:
    """The fields later versions added, filled in as older versions mean them, then checked."""
    meta.setdefault("mixture", None)  # version 1: a fixed mixture
    meta.setdefault("blend", dict(MANIFEST_BLEND))  # versions 1 and 2: the manifest's blend
    meta.setdefault("files", None)  # versions 1-3: no record of the files
    meta.setdefault("init_from", None)  # versions 1-4: the seed's weights
    if meta["init_from"] is not None and not (
        isinstance(meta["init_from"], dict) and {"path", "kind", "sha256"} <= set(meta["init_from"])
    ):
        raise CheckpointError(f"{path}: field 'init_from' is not {{path, kind, sha256}}")
    if meta["files"] is not None and not (
        isinstance(meta["files"], dict)
        and all(
            isinstance(v, dict)
            and isinstance(v.get("bytes"), int)
            and isinstance(v.get("sha256"), str)
            and "/" not in k
            and k not in ("", ".", "..")
            for k, v in meta["files"].items()
        )
    ):
        raise CheckpointError(f"{path}: field 'files' should be null or {{name: {{bytes, sha256}}}}")
    if meta["mixture"] is not None and not isinstance(meta["mixture"], dict):
        raise CheckpointError(f"{path}: field 'mixture' should be null or a dict, got {meta['mixture']!r}")


def _check_fields(path: Path, step_dir: Path, meta: dict[str, Any]) -> None:
    """Every field of :data:`_FIELDS` present with its type; the step a ``step_N`` folder's name
    says; the layout's sizes; the trainer's and the sampler's keys; a known precision."""
    for key, tp in _FIELDS.items():
        if key not in meta:
            raise CheckpointError(f"{path}: field '{key}' is missing")
        if not isinstance(meta[key], tp) or isinstance(meta[key], bool):
            raise CheckpointError(f"{path}: field '{key}' should be a {tp.__name__}, got {meta[key]!r}")
    want = step_of_dir_name(step_dir.name, step_dir) if _TAG.match(step_dir.name) else meta["step"]
    if meta["step"] != want:
        raise CheckpointError(f"{path}: field 'step' is {meta['step']}, the folder is {step_dir.name}")
    for k in LAYOUT_KEYS:
        v = meta["layout"].get(k)
        if not isinstance(v, int) or v < (0 if k == "zero_stage" else 1):
            raise CheckpointError(f"{path}: field 'layout.{k}' is {v!r}")
    missing = [k for k in TRAINER_KEYS if k not in meta["trainer"]]
    if missing:
        raise CheckpointError(f"{path}: field 'trainer' lacks {missing}")
    missing = [k for k in SAMPLER_KEYS if k not in meta["sampler"]]
    if missing:
        raise CheckpointError(f"{path}: field 'sampler' lacks {missing}")
    if meta["precision"] not in PRECISIONS:
        raise CheckpointError(f"{path}: field 'precision' is {meta['precision']!r}, not one of {sorted(PRECISIONS)}")


def _check_model(path: Path, meta: dict[str, Any]) -> None:
    """A valid model config, a sha256 of the data manifest, and TP rules for exactly the model's
    parameters, each cut along dim 0, 1 or not at all."""
    try:
        cfg = from_dict(ModelConfig, meta["model"], "model")
    except ConfigError as e:
        raise CheckpointError(f"{path}: field '{e.key}': {e.message}") from None
    if not re.fullmatch(r"[0-9a-f]{64}", meta["data_manifest_sha256"]):
        raise CheckpointError(f"{path}: field 'data_manifest_sha256' is not a sha256 hex digest")
    from training.model.bloom import full_shapes

    names = set(full_shapes(cfg))
    if set(meta["tp_rules"]) != names:
        odd = sorted(set(meta["tp_rules"]) ^ names)[:3]
        raise CheckpointError(f"{path}: field 'tp_rules' does not list exactly the model's parameters (e.g. {odd})")
    bad = {k: v for k, v in meta["tp_rules"].items() if v not in (None, 0, 1)}
    if bad:
        raise CheckpointError(f"{path}: field 'tp_rules' has cut dims other than null, 0, 1: {bad}")


def model_config(meta: dict[str, Any]) -> ModelConfig:
    return from_dict(ModelConfig, meta["model"])


def saved_recipe(meta: dict[str, Any]) -> TrainRecipe:
    recipe = copy.deepcopy(meta["recipe"])
    for knob in ("cpu_fp16", "inject_nan_at"):  # test switches that recipes held once (training/config/drills.py)
        recipe.get("train", {}).pop(knob, None)
    return from_dict(TrainRecipe, recipe)
