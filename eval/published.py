"""What an evaluation loads: a bloomline checkpoint, or a published model evaluated as it is
(``bloomline evaluate --model FOLDER``), a Hugging Face BLOOM folder of any size.

A folder is read by the loader ``train.init_from`` uses (training/checkpoint/init_from.py:
safetensors memory-mapped, pickles only through the loader that runs no code) and evaluated as a
checkpoint is, in one process or at any ``parallel`` layout, on text prepared with the folder's own
tokenizer. What an evaluation reads of a checkpoint's bloomline.json, a folder holds elsewhere;
:func:`evaluated_meta` gathers it: the shape from ``config.json``; the vocabulary from the data's
tokenizer, which must be the folder's ``tokenizer.json`` byte for byte; step 0 (the model before
any training of ours, as a continued run's step 0 is); no training tokens seen; the layout
:data:`PUBLISHED` (eval/RESULTS.md). The embedding's rows past the tokenizer are padding and are
dropped, as for ``train.init_from``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from bloomline.config import to_dict
from bloomline.errors import CheckpointError, DataError
from bloomline.io import sha256_file
from data_prep.storage.shards import load_manifest, manifest_path, manifest_sha256
from training.checkpoint.meta import check_trained_on, model_config, read_meta
from training.checkpoint.run_dir import META_FILE
from training.config import ModelConfig

PUBLISHED = "hf"
"""The ``layout`` of a published model's rows: a Hugging Face folder, written by no layout of ours."""
SETTING = "--model"

Weights = Callable[[set[str]], Mapping[str, torch.Tensor]]
"""The whole tensors of the named ``Bloom.layers()`` layers, by parameter name."""


def is_published(path: str | Path) -> bool:
    """Whether ``path`` is a Hugging Face model folder (``config.json``) rather than a checkpoint."""
    p = Path(path)
    return (p / "config.json").is_file() and not (p / META_FILE).is_file()


def evaluated_meta(path: Path, data_dir: Path) -> dict[str, Any]:
    """The bloomline.json fields an evaluation reads, checked against the data: a checkpoint's own
    (trained on exactly ``data_dir``), or a published folder's (:func:`published_meta`)."""
    if is_published(path):
        return published_meta(path, data_dir)
    meta = read_meta(path)
    check_trained_on(
        meta, data_dir, path, "the checkpoint was trained on other data; evaluate it with the --data it was trained on"
    )
    return meta


def published_meta(folder: Path, data_dir: Path) -> dict[str, Any]:
    """A published folder's evaluation metadata (module docstring); one line for a folder that is
    not a BLOOM, or data not tokenized with its tokenizer."""
    from training.checkpoint.init_from import open_source

    src = open_source(folder, SETTING)
    manifest = load_manifest(data_dir)
    tok = manifest["tokenizer"]
    if src.tokenizer is None:
        raise CheckpointError(f"{SETTING}: {folder} has no tokenizer.json; a model is evaluated on text cut by its own")
    if sha256_file(src.tokenizer) != tok["sha256"]:
        raise DataError(
            f"{manifest_path(data_dir)}: the data was tokenized with another tokenizer than {src.tokenizer}: give "
            f"--text (it is prepared with the model's), or data prepared with -o tokenizer.model={folder}"
        )
    if int(tok["vocab_size"]) > src.rows:
        raise CheckpointError(f"{SETTING}: {folder}'s embedding has {src.rows} rows, its tokenizer {tok['vocab_size']}")
    cfg = ModelConfig(vocab_size=int(tok["vocab_size"]), seq_len=int(manifest["seq_len"]), **src.shape)
    cfg.validate()
    return {
        "kind": PUBLISHED,
        "step": 0,
        "model": to_dict(cfg),
        "layout": None,
        "sampler": {"tokens_by_lang": {}},
        "data_manifest_sha256": manifest_sha256(data_dir),
    }


def weights_of(path: Path, meta: dict[str, Any], data_dir: Path) -> tuple[Weights, bool]:
    """How to read the model's tensors, layer by layer; and whether the layers must be read together
    (a ZeRO-3 checkpoint: DeepSpeed gathers a rank's partitions at once)."""
    from training.checkpoint.load import layer_of, merged_weights
    from training.model.bloom import full_shapes

    if meta.get("kind") != PUBLISHED:
        return (lambda layers: merged_weights(path, meta, layers)), meta["layout"]["zero_stage"] == 3
    from training.checkpoint.init_from import init_weights, open_source

    cfg = model_config(meta)
    tensor = init_weights(open_source(path, SETTING), cfg, load_manifest(data_dir)["tokenizer"], data_dir)
    names = list(full_shapes(cfg))
    return (lambda layers: {n: tensor(n) for n in names if layer_of(n) in layers}), False


def load_whole(path: Path, meta: dict[str, Any], data_dir: Path, dtype: torch.dtype) -> Any:
    """The whole single-device ``Bloom`` in ``dtype`` (eval mode, on the CPU): a checkpoint's, of
    any layout, or a published folder's."""
    from training.checkpoint.load import check_files, load_model
    from training.model.bloom import Bloom
    from training.parallel.parallelize import build_on_device

    if meta.get("kind") != PUBLISHED:
        check_files(path, meta)
        return load_model(path, dtype)[0]
    read, _ = weights_of(path, meta, data_dir)
    with torch.device("meta"):
        model = Bloom(model_config(meta))
    for name, layer in model.layers():  # one layer's tensors at a time: never the whole model twice
        build_on_device(layer, name + ".", read({name}).__getitem__, torch.device("cpu")).to(dtype)
    return model.eval()
