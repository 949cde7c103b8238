"""How the model is spread over ranks: ``parallel:``, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from bloomline.config import check
from bloomline.errors import ConfigError

if TYPE_CHECKING:
    from training.config.model import ModelConfig


@dataclass
class ParallelConfig:
    """How the model is spread over ranks (torchtitan-style: one validated place).

    Rank order is Megatron/DeepSpeed's: tp varies fastest, then dp, then pp."""

    tp: int = 1
    """Tensor-parallel degree (megatron-core Column/RowParallelLinear, VocabParallelEmbedding)."""
    pp: int = 1
    """Pipeline stages (DeepSpeed PipelineModule, partitioned by transformer layers)."""
    dp: int = 1
    """Data-parallel replicas."""
    zero_stage: int = 1
    """ZeRO stage for data parallelism: 0-3 without PP, 0-1 with PP."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend; auto: nccl on GPUs, gloo on CPU."""
    offload_optimizer: Literal["none", "cpu"] = "none"
    """ZeRO-Offload (what ``bloomline plan --offload`` plans): ``cpu`` keeps each rank's ZeRO partition of
    the fp32 master weights, gradients and Adam moments in CPU memory and steps it there with
    DeepSpeed's CPU Adam (DeepSpeed's ``zero_optimization.offload_optimizer``). Needs zero_stage >= 1."""

    def validate(self) -> None:
        for k in ("tp", "pp", "dp"):
            check(getattr(self, k) >= 1, k, "must be >= 1")
        check(0 <= self.zero_stage <= 3, "zero_stage", "must be 0, 1, 2 or 3")
        check(
            not (self.pp > 1 and self.zero_stage > 1),
            "zero_stage",
            f"ZeRO stage {self.zero_stage} cannot be combined with pipeline parallelism (pp={self.pp}): stages 2 and 3 "
            "partition gradients/parameters across data-parallel ranks while the pipeline accumulates gradients over "
            "micro-batches, which DeepSpeed refuses. Use zero_stage 0 or 1 with pp > 1.",
        )
        check(
            not (self.offload_optimizer != "none" and self.zero_stage == 0),
            "offload_optimizer",
            "offloads ZeRO's optimizer partitions, and zero_stage 0 has none (DeepSpeed would silently keep the "
            "optimizer on the device): set zero_stage >= 1, or offload_optimizer none",
        )

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise ConfigError(
                "parallel",
                f"tp·pp·dp = {self.tp}·{self.pp}·{self.dp} = {self.world_size} does not match "
                f"the world size {world_size}",
            )

    def check_model(self, model: ModelConfig) -> None:
        if model.num_heads % self.tp:
            raise ConfigError("parallel.tp", f"num_heads={model.num_heads} is not divisible by tp={self.tp}")
        if model.hidden_size % self.tp:
            raise ConfigError("parallel.tp", f"hidden_size={model.hidden_size} is not divisible by tp={self.tp}")
        if model.vocab_size is not None and model.padded_vocab(self.tp) % self.tp:
            raise ConfigError("model.pad_vocab_to", f"{model.pad_vocab_to} rows do not split over tp={self.tp}")
        if model.num_layers < self.pp:
            raise ConfigError(
                "parallel.pp",
                f"pp={self.pp} pipeline stages need at least {self.pp} layers, the model has {model.num_layers}",
            )
