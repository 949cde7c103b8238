"""What an evaluation loads: a bloomline checkpoint, or a published model evaluated as it is
(``bloomline evaluate --model FOLDER``), a Hugging Face BLOOM folder of any size.

A folder is read by the loader ``train.init_from`` uses (training/hf/from_hf.py:
safetensors memory-mapped, pickles only through the loader that runs no code) and evaluated as a
checkpoint is, in one process or at any ``parallel`` layout, on text prepared with the folder's own
tokenizer. What an evaluation reads of a checkpoint's bloomline.json, a folder holds elsewhere;
:func:`evaluated_meta` gathers it: the shape from ``config.json``; the vocabulary from the data's
tokenizer, which must be the folder's ``tokenizer.json`` byte for byte; step 0 (the model before
any training of ours, as a continued run's step 0 is); no training tokens seen; the layout
:data:`PUBLISHED` (eval/RESULTS.md). The embedding's rows past the tokenizer are padding and are
dropped, as for ``train.init_from``. A causal LM of another architecture (``model_type`` not
``bloom``) is loaded as transformers' own class (no code from the folder) and evaluated in one
process (eval/model.py ``TransformersModel``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

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


@dataclass
class OtherModel:
    """What an evaluation needs of a causal LM of another architecture than BLOOM (the
    ``EvalModel.cfg`` of eval/model.py ``TransformersModel``)."""

    arch: str
    """transformers' ``model_type`` (``gpt2``, ``llama``…)."""
    vocab_size: int
    """The tokenizer's: logits past it are the embedding's padding."""
    seq_len: int
    """The longest context a task gives it: the data's largest bucket."""


def architecture(folder: Path) -> str:
    """The folder's ``model_type`` (config.json); one line when there is none."""
    try:
        conf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{SETTING}: {folder / 'config.json'}: {e}") from None
    return str(conf.get("model_type") or "")


def check_tokenizer(folder: Path, data_dir: Path) -> dict[str, Any]:
    """The data's tokenizer entry, once it is the folder's tokenizer.json byte for byte."""
    own = folder / "tokenizer.json"
    if not own.is_file():
        raise CheckpointError(f"{SETTING}: {folder} has no tokenizer.json; a model is evaluated on text cut by its own")
    tok = load_manifest(data_dir)["tokenizer"]
    if sha256_file(own) != tok["sha256"]:
        raise DataError(
            f"{manifest_path(data_dir)}: the data was tokenized with another tokenizer than {own}: give "
            f"--text (it is prepared with the model's), or data prepared with -o tokenizer.model={folder}"
        )
    return tok


def published_meta(folder: Path, data_dir: Path) -> dict[str, Any]:
    """A published folder's evaluation metadata (module docstring); one line for data not
    tokenized with its tokenizer. A BLOOM is built as bloomline's ``Bloom`` (any layout); another
    causal LM is transformers' own class, in one process (``arch``, ``other``)."""
    from training.hf.from_hf import open_source

    arch = architecture(folder)
    tok = check_tokenizer(folder, data_dir)
    manifest = load_manifest(data_dir)
    common = {"kind": PUBLISHED, "step": 0, "layout": None, "sampler": {"tokens_by_lang": {}}}
    common["data_manifest_sha256"] = manifest_sha256(data_dir)
    if arch != "bloom":
        other = OtherModel(arch, int(tok["vocab_size"]), int(manifest["seq_len"]))
        return {**common, "arch": arch, "model": None, "other": asdict(other)}
    src = open_source(folder, SETTING)
    if int(tok["vocab_size"]) > src.rows:
        raise CheckpointError(f"{SETTING}: {folder}'s embedding has {src.rows} rows, its tokenizer {tok['vocab_size']}")
    cfg = ModelConfig(vocab_size=int(tok["vocab_size"]), seq_len=int(manifest["seq_len"]), **src.shape)
    cfg.validate()
    return {**common, "arch": arch, "model": to_dict(cfg)}


def other_model(meta: dict[str, Any]) -> Optional[OtherModel]:
    """A published model of another architecture than BLOOM: what the evaluation needs of it."""
    return OtherModel(**meta["other"]) if meta.get("other") else None


def weights_of(path: Path, meta: dict[str, Any], data_dir: Path) -> tuple[Weights, bool]:
    """How to read the model's tensors, layer by layer; and whether the layers must be read together
    (a ZeRO-3 checkpoint: DeepSpeed gathers a rank's partitions at once)."""
    from training.checkpoint.load import layer_of, merged_weights
    from training.model.bloom import full_shapes

    if meta.get("kind") != PUBLISHED:
        return (lambda layers: merged_weights(path, meta, layers)), meta["layout"]["zero_stage"] == 3
    from training.hf.from_hf import init_weights, open_source

    cfg = model_config(meta)
    tensor = init_weights(open_source(path, SETTING), cfg, load_manifest(data_dir)["tokenizer"], data_dir)
    names = list(full_shapes(cfg))
    return (lambda layers: {n: tensor(n) for n in names if layer_of(n) in layers}), False


def load_whole(path: Path, meta: dict[str, Any], data_dir: Path, dtype: torch.dtype) -> Any:
    """The whole single-device ``Bloom`` in ``dtype`` (eval mode, on the CPU): a checkpoint's, of
    any layout, or a published folder's; for another architecture, transformers' model."""
    from training.checkpoint.load import load_model
    from training.model.bloom import Bloom
    from training.parallel.parallelize import build_on_device

    other = other_model(meta)
    if other is not None:  # transformers' own class, its weights as they are (no code from the folder)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True, trust_remote_code=False)
    if meta.get("kind") != PUBLISHED:
        return load_model(path, dtype, meta)[0]
    read, _ = weights_of(path, meta, data_dir)
    with torch.device("meta"):
        model = Bloom(model_config(meta))
    for name, layer in model.layers():  # one layer's tensors at a time: never the whole model twice
        build_on_device(layer, name + ".", read({name}).__getitem__, torch.device("cpu")).to(dtype)
    return model.eval()
