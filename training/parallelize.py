"""Parallelism applied from outside the single-device model (torchtitan's order: TP, then PP,
then data parallelism with ZeRO, which DeepSpeed wraps around the result).

* :func:`init_distributed` starts torch.distributed (gloo on CPU, nccl on GPUs) and
  megatron-core's model-parallel groups; its rank order — tp fastest, then dp, then pp — is
  the order of DeepSpeed's ``PipeModelDataParallelTopology``, so both agree on every group.
* Tensor parallelism: :func:`tp_block` etc. build the single-device module
  (``training.model``) and swap its ``nn.Linear``/``nn.Embedding`` for megatron-core
  ``ColumnParallelLinear``/``RowParallelLinear``/``VocabParallelEmbedding`` holding this rank's
  slice of the very same weights, so TP=n computes what TP=1 computes (tested).
  qkv and fc1 are column-parallel (whole heads per rank), dense and fc2 row-parallel; the
  word embedding is split by vocabulary and the output logits stay vocabulary-parallel.
* Pipeline parallelism: :func:`layer_specs` lists the model as DeepSpeed ``LayerSpec``\\ s —
  embedding (tied), embedding LayerNorm, blocks, final LayerNorm, output head (the same tied
  embedding) — partitioned by transformer layers. Without PP the same layers run in order as
  one module (:class:`SequentialBloom`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from training.config import ModelConfig, ParallelConfig
from training.model import Block, mask_padded_vocab

IGNORE_INDEX = -100


@dataclass
class Mesh:
    """This rank's place in the TP × DP × PP grid."""

    rank: int
    world: int
    tp: int
    dp: int
    pp: int
    tp_rank: int
    dp_rank: int
    pp_rank: int

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def init_distributed(parallel: ParallelConfig, seed: int) -> Mesh:
    """Start torch.distributed and megatron-core's groups; returns this rank's coordinates."""
    import deepspeed
    from megatron.core import parallel_state, tensor_parallel

    backend = parallel.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        # Before any communicator exists: NCCL binds each one to the current device, and with
        # every rank still on cuda:0 the ranks of a node would collide on one GPU.
        # modulo: launchers that give each process one GPU (srun) still number LOCAL_RANK 0..n-1
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
    world = torch.distributed.get_world_size()
    parallel.check_world(world)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=parallel.tp,
                                             pipeline_model_parallel_size=parallel.pp)
    rank = torch.distributed.get_rank()
    mesh = Mesh(rank, world, parallel.tp, parallel.dp, parallel.pp,
                parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_data_parallel_rank(),
                parallel_state.get_pipeline_model_parallel_rank())
    # Cross-check with DeepSpeed's topology: the two frameworks must agree on who is who.
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    topo = PipeModelDataParallelTopology(num_pp=parallel.pp, num_mp=parallel.tp, num_dp=parallel.dp)
    coord = topo.get_coord(rank)
    assert (coord.pipe, coord.data, coord.model) == (mesh.pp_rank, mesh.dp_rank, mesh.tp_rank), (coord, mesh)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return mesh


class DeepSpeedMPU:
    """megatron-core's groups in the interface DeepSpeed expects as ``mpu`` (without PP, where no
    pipeline grid tells DeepSpeed which ranks are tensor-parallel peers rather than replicas)."""

    def __init__(self) -> None:
        from megatron.core import parallel_state as ps

        self.ps = ps

    def get_model_parallel_rank(self) -> int:
        return self.ps.get_tensor_model_parallel_rank()

    def get_model_parallel_world_size(self) -> int:
        return self.ps.get_tensor_model_parallel_world_size()

    def get_model_parallel_group(self) -> Any:
        return self.ps.get_tensor_model_parallel_group()

    # the same under megatron's newer names (DeepSpeed's universal-checkpoint loader asks for these)
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self) -> int:
        return self.ps.get_data_parallel_rank()

    def get_data_parallel_world_size(self) -> int:
        return self.ps.get_data_parallel_world_size()

    def get_data_parallel_group(self) -> Any:
        return self.ps.get_data_parallel_group()


def megatron_config(parallel: ParallelConfig, dtype: torch.dtype) -> Any:
    from megatron.core import ModelParallelConfig

    return ModelParallelConfig(
        tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
        use_cpu_initialization=True, perform_initialization=False,  # weights are copied in, see _shard
        params_dtype=torch.float32, pipeline_dtype=dtype, sequence_parallel=False,
        gradient_accumulation_fusion=False,
    )


# ------------------------------------------------------------------------------ tensor parallel

def _tp() -> tuple[int, int]:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1
    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


def _mark_tp(param: torch.Tensor, dim: int) -> None:
    """Tag a sharded parameter as megatron's initialiser would (it is skipped here, since the
    weights are copied in): DeepSpeed's gradient norm and clipping sum such parameters over TP
    ranks and count untagged (replicated) ones once."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    if not getattr(param, "tensor_model_parallel", False):
        for attr in ("tensor_model_parallel", "partition_dim", "partition_stride"):
            if hasattr(param, attr):
                delattr(param, attr)
        set_tensor_model_parallel_attributes(param, True, dim, 1)


class _Sharded(nn.Module):
    """A megatron-core parallel linear holding this rank's slice of a single-device ``nn.Linear``,
    returning only its output (megatron returns ``(output, bias)``)."""

    def __init__(self, lin: nn.Linear, mcfg: Any, column: bool):
        super().__init__()
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        rank, size = _tp()
        out, inp = lin.weight.shape
        with torch.no_grad():
            if column:  # output rows split: whole heads (qkv) / MLP columns (fc1) per rank
                self.inner = ColumnParallelLinear(inp, out, config=mcfg, init_method=lambda w: None, bias=True,
                                                  gather_output=False, skip_bias_add=False)
                rows = out // size
                self.inner.weight.copy_(lin.weight[rank * rows:(rank + 1) * rows])
                self.inner.bias.copy_(lin.bias[rank * rows:(rank + 1) * rows])
                _mark_tp(self.inner.weight, 0)
            else:  # input columns split; the output is all-reduced, then the (replicated) bias added
                self.inner = RowParallelLinear(inp, out, config=mcfg, init_method=lambda w: None, bias=True,
                                               input_is_parallel=True, skip_bias_add=False)
                cols = inp // size
                self.inner.weight.copy_(lin.weight[:, rank * cols:(rank + 1) * cols])
                self.inner.bias.copy_(lin.bias)
                _mark_tp(self.inner.weight, 1)

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)[0]


def tp_block(cfg: ModelConfig, mcfg: Any, layer_idx: int, seed: int) -> Block:
    """Block ``layer_idx`` with its linears sharded over TP. Seeded per layer, so every TP rank
    (and the single-device model built with the same seeds) starts from the same full weights."""
    torch.manual_seed(seed + 1 + layer_idx)
    block = Block(cfg)
    rank, size = _tp()
    if size > 1:
        block.attn.qkv = _Sharded(block.attn.qkv, mcfg, column=True)
        block.attn.dense = _Sharded(block.attn.dense, mcfg, column=False)
        block.mlp.fc1 = _Sharded(block.mlp.fc1, mcfg, column=True)
        block.mlp.fc2 = _Sharded(block.mlp.fc2, mcfg, column=False)
        heads = cfg.num_heads // size
        block.attn.alibi_slopes = block.attn.alibi_slopes[rank * heads:(rank + 1) * heads].clone()
    return block


class TPEmbedding(nn.Module):
    """The word embedding, split by vocabulary over TP ranks. Used twice in a pipeline: as the
    input embedding (first stage) and, tied, as the output projection (last stage);
    ``weight`` is the attribute DeepSpeed ties."""

    def __init__(self, cfg: ModelConfig, mcfg: Any, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        rank, size = _tp()
        self.vocab_size = cfg.vocab_size  # rows beyond it are padding, masked in head_logits
        # Padded to a multiple of 128·TP (Megatron's rule) so the table splits evenly.
        full = nn.Embedding(cfg.padded_vocab(tp=size), cfg.hidden_size)
        nn.init.normal_(full.weight, mean=0.0, std=cfg.init_std)
        if size > 1:
            from megatron.core.tensor_parallel import VocabParallelEmbedding

            self.word_embeddings = VocabParallelEmbedding(full.num_embeddings, full.embedding_dim, config=mcfg,
                                                          init_method=lambda w: None)
            rows = full.num_embeddings // size
            with torch.no_grad():
                self.word_embeddings.weight.copy_(full.weight[rank * rows:(rank + 1) * rows])
            _mark_tp(self.word_embeddings.weight, 0)
        else:
            self.word_embeddings = full

    @property
    def weight(self) -> torch.Tensor:
        return self.word_embeddings.weight

    def forward(self, inputs: Any, head: bool = False) -> Any:
        """(input_ids, segment_ids) → (hidden, segment_ids); with ``head``: hidden → logits.
        The output projection goes through this module's own forward so that ZeRO-3, which
        gathers a module's partitioned weights around its forward, gathers them for it too."""
        if head:
            return head_logits(self, inputs)
        input_ids, segment_ids = inputs
        return self.word_embeddings(input_ids), segment_ids


def head_logits(embedding: TPEmbedding, hidden: torch.Tensor) -> torch.Tensor:
    """Output projection through the tied embedding → vocabulary-parallel logits [B, T, V/tp]."""
    rank, size = _tp()
    if size > 1:
        from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

        # identity forward, all-reduce of the input gradient backward (each rank sees V/tp columns)
        hidden = copy_to_tensor_model_parallel_region(hidden)
    logits = F.linear(hidden, embedding.weight)
    return mask_padded_vocab(logits, embedding.vocab_size, rank * logits.shape[-1])


class EmbedNorm(nn.Module):
    """The LayerNorm after the word embedding (BLOOM §3.2.2)."""

    def __init__(self, cfg: ModelConfig, seed: int):
        super().__init__()
        self.embed_ln = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)  # init: ones / zeros

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, segment_ids = inputs
        return self.embed_ln(hidden), segment_ids


class PipeBlock(nn.Module):
    """A Block taking and returning ``(hidden, segment_ids)``, as pipeline layers must."""

    def __init__(self, cfg: ModelConfig, mcfg: Any, layer_idx: int, seed: int):
        super().__init__()
        self.block = tp_block(cfg, mcfg, layer_idx, seed)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, segment_ids = inputs
        return self.block(hidden, segment_ids), segment_ids


class FinalNorm(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int):
        super().__init__()
        self.final_ln = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.final_ln(inputs[0])


def layer_specs(cfg: ModelConfig, mcfg: Any, seed: int) -> list[Any]:
    """The model as DeepSpeed pipeline layers; the embedding is tied across first and last stage."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    return [
        TiedLayerSpec("embed", TPEmbedding, cfg, mcfg, seed, tied_weight_attr=["weight"]),
        LayerSpec(EmbedNorm, cfg, seed),
        *[LayerSpec(PipeBlock, cfg, mcfg, i, seed) for i in range(cfg.num_layers)],
        LayerSpec(FinalNorm, cfg, seed),
        TiedLayerSpec("embed", TPEmbedding, cfg, mcfg, seed, forward_fn=head_logits, tied_weight_attr=["weight"]),
    ]


class SequentialBloom(nn.Module):
    """The same layers without pipeline parallelism: (input_ids, segment_ids) → local logits."""

    def __init__(self, cfg: ModelConfig, mcfg: Any, seed: int, checkpoint: bool = False):
        super().__init__()
        self.embedding = TPEmbedding(cfg, mcfg, seed)
        self.embed_norm = EmbedNorm(cfg, seed)
        self.blocks = nn.ModuleList(PipeBlock(cfg, mcfg, i, seed) for i in range(cfg.num_layers))
        self.final_norm = FinalNorm(cfg, seed)
        self.checkpoint = checkpoint

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = self.embed_norm(self.embedding(inputs))
        for blk in self.blocks:
            if self.checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.embedding(self.final_norm(x), head=True)


# ------------------------------------------------------------------------------------- the loss

def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of per-token cross-entropy over labelled positions, number of them), fp32.

    Vocabulary-parallel logits go through megatron-core's ``vocab_parallel_cross_entropy``
    (each rank holds V/tp columns; the softmax normaliser is all-reduced)."""
    mask = labels != IGNORE_INDEX
    safe = torch.where(mask, labels, torch.zeros_like(labels))
    rank, size = _tp()
    if size > 1:
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        per_token = vocab_parallel_cross_entropy(logits.float(), safe)
    else:
        per_token = F.cross_entropy(logits.float().flatten(0, 1), safe.flatten(), reduction="none").view_as(labels)
    return (per_token * mask).sum(), mask.sum()


class StepLoss:
    """Loss of one micro-batch, scaled so DeepSpeed's averaging gives the step's token mean.

    DeepSpeed divides each micro-batch loss by the number of micro-batches (gas) and averages
    gradients over DP ranks; micro-batches hold different numbers of labelled tokens. Scaling
    the summed token loss by gas·dp / (labelled tokens of the whole step, all ranks) makes the
    final gradient exactly that of the mean token loss of the step.

    Skipping a bad batch: when a micro-batch's mean token loss is not finite, or exceeds
    ``spike_limit``, its loss is made NaN on purpose. The NaN reaches every rank's gradients
    through the all-reduces, DeepSpeed finds the global gradient norm invalid and skips the
    optimizer step on all ranks alike (counted in ``engine.skipped_steps``)."""

    def __init__(self) -> None:
        self.scale = 1.0
        self.spike_limit = math.inf
        self.poison = False  # fault injection for tests (BLOOMLINE_INJECT_NAN_STEP)
        self.bad = False

    def set_step(self, gas: int, dp: int, step_tokens: int, spike_limit: float = math.inf, poison: bool = False) -> None:
        self.scale = gas * dp / max(step_tokens, 1)
        self.spike_limit = spike_limit
        self.poison = poison
        self.bad = False

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        total, n = token_losses(logits, labels)
        mean = float(total.detach()) / max(int(n), 1)
        if self.poison or not math.isfinite(mean) or mean > self.spike_limit:
            self.bad = True
            return total * float("nan")
        return total * self.scale


def checkpoint_fn() -> Callable:
    return partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
