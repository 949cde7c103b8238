"""The main job's recipe (configs/pipeline/): which data, training and export recipes it chains.

A pipeline recipe names a data recipe and a training recipe and may change any of their values
in place, so one file says what the whole job does::

    data:
      recipe: ../data/demo.yaml     # configs/data/, relative to this file
      dask: {n_workers: 2}          # any PrepareConfig value, over the recipe's
    train:
      recipe: ../train/bloom-tiny.yaml
      parallel: {dp: 2}

``-o train.parallel.dp=2`` on the command line reaches the same value.

The model's vocabulary and sequence length are the data's, since the job makes the tokenizer
and the buckets: ``train.model.vocab_size`` and ``train.model.seq_len`` come from the prepared
data (the train stage says what it derived) unless this recipe or ``-o`` sets them, and a value
set that contradicts the data is refused before training starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bloomline import REPO
from bloomline.config import check, load_config, to_dict
from bloomline.errors import ConfigError
from data_prep.config import PrepareConfig
from training.config import DATA_SHAPED, EvalConfig, ModelConfig, TrainRecipe

CONFIGS = REPO / "configs"
DEFAULT_RECIPES = {
    "data": CONFIGS / "data" / "demo.yaml",
    "train": CONFIGS / "train" / "bloom-tiny.yaml",
    "eval": CONFIGS / "eval" / "default.yaml",
    "pipeline": CONFIGS / "pipeline" / "demo.yaml",
}
"""The recipe a command reads without ``--config``, by its folder under configs/ (a key of
:data:`SCHEMAS`); ``bloomline serve``'s deployments start from them too."""
BLOOM_DATA_RECIPE = CONFIGS / "data" / "bloom.yaml"
"""BLOOM's data settings, for a real corpus (``bloomline filters --derive`` scores by them)."""
HELDOUT_RECIPE = CONFIGS / "data" / "heldout.yaml"
"""How ``bloomline evaluate --text`` prepares the text a published model is evaluated on."""


EXPORT_DTYPES = ("fp32", "bf16")
"""What an export's weights may be: ``export.dtype`` of a pipeline recipe, ``bloomline export --dtype``."""


@dataclass
class ExportStageConfig:
    enabled: bool = True
    """Export the final checkpoint as a Hugging Face BloomForCausalLM (RUN_DIR/hf)."""
    dtype: str = "fp32"
    """fp32 or bf16 weights in the export."""

    def validate(self) -> None:
        check(self.dtype in EXPORT_DTYPES, "dtype", f"'{self.dtype}': use {' or '.join(EXPORT_DTYPES)}")


@dataclass
class PipelineConfig:
    data: PrepareConfig = field(default_factory=PrepareConfig)
    """Data preparation: ``recipe:`` (a file in configs/data/) and values over it."""
    train: TrainRecipe = field(default_factory=TrainRecipe)
    """Training, with the evaluation of every checkpoint: ``recipe:`` (configs/train/) and values over it."""
    export: ExportStageConfig = field(default_factory=ExportStageConfig)
    """The Hugging Face export of the final checkpoint."""

    @classmethod
    def expand_raw(cls, raw: dict[str, Any], base: Path) -> dict[str, Any]:
        """Replace each section's ``recipe: FILE`` by that recipe, loaded (its paths resolved
        against its own folder), with the section's other keys laid over it."""
        raw = dict(raw)
        for key, schema in (("data", PrepareConfig), ("train", TrainRecipe)):
            section = raw.get(key) or {}
            if not isinstance(section, dict):
                continue  # from_dict names the key and the expected type
            section = dict(section)
            recipe = section.pop("recipe", None)
            if recipe is not None:
                path = Path(recipe) if Path(recipe).is_absolute() else base / recipe
                loaded = to_dict(load_config(schema, path))
                if schema is PrepareConfig:  # the manifest names the recipe the data was made by
                    loaded["recipe"] = str(recipe)
                if schema is TrainRecipe:  # the data's, unless this recipe sets them (or -o does, later)
                    own = section.get("model") if isinstance(section.get("model"), dict) else {}
                    loaded["model"].update({k: None for k in DATA_SHAPED if k not in own})
                section = _merge(loaded, section)
            raw[key] = section
        return raw

    def resolve_paths(self, base: Path) -> None:
        self.train.resolve_paths(base)


def _merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(under)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Which schema a recipe folder holds: here, in the one layer that knows them all.
# tests/test_configs.py loads every file in configs/ through this table, so a recipe that stops
# matching its schema fails CI.
SCHEMAS: dict[str, type] = {
    "data": PrepareConfig,
    "model": ModelConfig,
    "train": TrainRecipe,
    "eval": EvalConfig,
    "pipeline": PipelineConfig,
}


def schema_for(path: Path) -> type:
    """The config dataclass for a recipe, chosen by its folder under ``configs/``."""
    folder = Path(path).resolve().parent.name
    if folder not in SCHEMAS:
        raise ConfigError("", f"{path}: no schema for recipes in configs/{folder}/ (known: {sorted(SCHEMAS)})")
    return SCHEMAS[folder]
