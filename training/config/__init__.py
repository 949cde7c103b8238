"""Typed configuration of ``bloomline train`` (recipes in ``configs/model/`` and ``configs/train/``).

A training recipe (``configs/train/*.yaml``) is a :class:`TrainRecipe`: the model, how it is
parallelised, the optimisation, the dynamic batches and checkpointing. ``model:`` may name a
file in ``configs/model/`` (``model: bloom-tiny``) or spell the model out inline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from bloomline.config import Location, check
from bloomline.errors import ConfigError
from training.config.batch import BatchConfig, BlendRuleConfig, OnlineMixtureConfig
from training.config.evaluation import EvalConfig, EvalParallelConfig, EvaluationConfig
from training.config.launch import BLOOM_NCCL_ENV, LAUNCHERS, LaunchConfig
from training.config.loop import CheckpointConfig, OptimConfig, TrainLoopConfig
from training.config.model import DATA_SHAPED, ModelConfig
from training.config.parallel import ParallelConfig

__all__ = [
    "BLOOM_NCCL_ENV",
    "DATA_SHAPED",
    "LAUNCHERS",
    "MODEL_DIR",
    "BatchConfig",
    "BlendRuleConfig",
    "CheckpointConfig",
    "EvalConfig",
    "EvalParallelConfig",
    "EvaluationConfig",
    "LaunchConfig",
    "ModelConfig",
    "OnlineMixtureConfig",
    "OptimConfig",
    "ParallelConfig",
    "TrainLoopConfig",
    "TrainRecipe",
]


@dataclass
class TrainRecipe:
    model: Union[Location, ModelConfig] = "bloom-tiny"
    """A recipe name in configs/model/ or the model spelled out."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """TP × PP × DP layout."""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """Dynamic batches."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and the LR schedule."""
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    """The loop."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints and restarts."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Per-language evaluation of every checkpoint, alongside training."""
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    """Which machines run the ranks, and the NCCL settings they get."""

    @staticmethod
    def model_recipe(name: str, base: Path) -> Path:
        for c in (base / name, base.parent / "model" / f"{name}.yaml", MODEL_DIR / f"{name}.yaml"):
            if c.is_file():
                return c
        raise ConfigError("model", f"no model recipe '{name}' (looked in {MODEL_DIR})")

    @classmethod
    def expand_raw(cls, raw: dict[str, Any], base: Path) -> dict[str, Any]:
        """Replace ``model: <name>`` by that recipe's keys, so ``-o model.hidden_size=...`` works."""
        import yaml

        name = raw.get("model", "bloom-tiny")
        if isinstance(name, str):
            raw = dict(raw)
            raw["model"] = yaml.safe_load(cls.model_recipe(name, base).read_text()) or {}
        return raw

    def resolve_paths(self, base: Path) -> None:
        if self.train.init_from and "://" not in self.train.init_from:
            self.train.init_from = str((base / self.train.init_from).resolve())
        if isinstance(self.model, str):
            from bloomline.config import load_config

            self.model = load_config(ModelConfig, self.model_recipe(self.model, base))
        self.parallel.check_model(self.model)

    def validate(self) -> None:
        if isinstance(self.model, ModelConfig):
            self.parallel.check_model(self.model)
        check(
            not (self.train.precision == "fp32" and self.parallel.zero_stage == 0),
            "parallel.zero_stage",
            "fp32 with zero_stage 0 cannot skip a NaN/inf batch (DeepSpeed's plain optimizer path has no overflow "
            "check); use zero_stage >= 1 or bf16",
        )
        check(
            not (
                self.batch.mixture == "online"
                and self.batch.online.rule == "evaluation"
                and not self.evaluation.enabled
            ),
            "batch.online.rule",
            "evaluation steers by the evaluations made while training runs: it needs evaluation.enabled=true",
        )
        check(
            self.evaluation.settings.heldout is None,
            "evaluation.settings.heldout",
            "the evaluations beside training are of the data's validation split (an online mixture steers by "
            "them); evaluate held-out data with bloomline evaluate --out DIR",
        )
        check(
            not (
                self.batch.mixture == "online"
                and self.batch.online.signal == "continuation"
                and "continuation" not in {t.name for t in self.evaluation.settings.tasks}
            ),
            "batch.online.signal",
            "continuation steers by the continuation task's accuracy: add {name: continuation} to "
            "evaluation.settings.tasks",
        )

    def check_device(self, gpu: bool, torch_version: str = "") -> None:
        """What this recipe needs of the machine it trains on: fp16 and FlexAttention train on GPUs only."""
        from training.config import drills

        if self.train.precision == "fp16" and not drills.cpu_fp16() and not gpu:
            raise ConfigError(
                "train.precision",
                "fp16 needs GPUs: DeepSpeed's CPU accelerator has no fp16 support on "
                "this CPU; use bf16 (BLOOM's choice) or fp32 here, or "
                f"set {drills.CPU_FP16}=1 to run fp16 slowly with torch's reference kernels",
            )
        if isinstance(self.model, ModelConfig) and self.model.attention == "flex" and not gpu:
            raise ConfigError(
                "model.attention",
                f"flex cannot train on CPU: FlexAttention has no CPU backward in torch "
                f"{torch_version}; use sdpa here (flex serves evaluation on CPU)",
            )


MODEL_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"
