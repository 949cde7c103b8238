"""Parallelism applied from outside the single-device model, in torchtitan's fixed order.

:func:`parallelize` takes a :class:`~training.model.bloom.Bloom` (built on the meta device, so no rank
ever allocates the modules it does not run) and this rank's place in the grid, and applies:

1. **Tensor parallelism** (:func:`apply_tp`): in every block, ``qkv``/``fc1`` become megatron-core
   ``ColumnParallelLinear`` (whole heads / MLP columns per rank), ``dense``/``fc2``
   ``RowParallelLinear``; the word embedding becomes ``VocabParallelEmbedding`` and its tied
   output projection yields vocabulary-parallel logits. Swapped in place: names do not change.
2. **Activation checkpointing** (:func:`apply_ac`): each block's forward recomputed in backward;
   then, with ``train.compile``, each block compiled (:func:`apply_compile`), as torchtitan does.
3. **Pipeline parallelism** (:func:`pipeline`): ``Bloom.layers()`` — the model's own modules —
   become a DeepSpeed ``PipelineModule``, cut at block boundaries, the embedding tied across the
   first and the last stage. Only this stage's layers are ever materialised.
4. **ZeRO data parallelism**: ``deepspeed.initialize`` with the recipe's stage.

Every materialised parameter is initialised by name (``training.model.bloom.initial_value``) and cut
to this rank's slice (``training.parallel.layout.tp_slice``), so the same seed gives the same function at
every layout (tested against the single-device model). Like megatron-core's CPU initialisation,
a rank draws the whole tensor of each parameter it holds a slice of and keeps its slice: a
transient cost, largest for the embedding (BLOOM-176B: 250,880 × 14,336 fp32 = 14 GB on each TP
rank of the first and last stage).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from training.config import ParallelConfig
from training.model.bloom import Bloom, full_shapes, initial_value
from training.parallel.distributed import DeepSpeedMPU, tp_rank_and_size
from training.parallel.layout import EMBEDDING, TIED_KEY, layout_of, tp_dim, tp_slice


def megatron_config(parallel: ParallelConfig, dtype: torch.dtype) -> Any:
    from megatron.core import ModelParallelConfig

    return ModelParallelConfig(
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        use_cpu_initialization=True,
        perform_initialization=False,  # weights are set by name, see build_on_device
        params_dtype=torch.float32,
        pipeline_dtype=dtype,
        sequence_parallel=False,
        gradient_accumulation_fusion=False,
    )


# ------------------------------------------------------------------------------ 1. tensor parallel


def _megatron_layers() -> tuple[type, type]:
    """megatron-core's parallel linears returning only their output (they return (output, bias))."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    class ColumnParallel(ColumnParallelLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(x)[0]

    class RowParallel(RowParallelLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(x)[0]

    return ColumnParallel, RowParallel


def apply_tp(model: Bloom, mcfg: Any) -> None:
    """Swap the model's linears and embedding for megatron-core's TP layers, in place, on the meta
    device (they are materialised and filled later). No-op at TP=1."""
    rank, size = tp_rank_and_size()
    if size == 1:
        return
    from megatron.core.tensor_parallel import VocabParallelEmbedding, copy_to_tensor_model_parallel_region

    column, row = _megatron_layers()
    cfg = model.cfg
    h = cfg.hidden_size
    with torch.device("meta"):
        for block in model.blocks:

            def col(lin: nn.Linear) -> nn.Module:
                return column(
                    lin.in_features,
                    lin.out_features,
                    config=mcfg,
                    init_method=lambda w: None,
                    bias=True,
                    gather_output=False,
                    skip_bias_add=False,
                )

            def rw(lin: nn.Linear) -> nn.Module:  # output all-reduced, then the whole bias added once
                return row(
                    lin.in_features,
                    lin.out_features,
                    config=mcfg,
                    init_method=lambda w: None,
                    bias=True,
                    input_is_parallel=True,
                    skip_bias_add=False,
                )

            block.attn.qkv, block.attn.dense = col(block.attn.qkv), rw(block.attn.dense)
            block.mlp.fc1, block.mlp.fc2 = col(block.mlp.fc1), rw(block.mlp.fc2)
            block.attn.first_head = rank * (cfg.num_heads // size)
        emb = model.embedding
        rows = cfg.padded_vocab(size)
        emb.word_embeddings = VocabParallelEmbedding(rows, h, config=mcfg, init_method=lambda w: None)
        emb.first_row = rank * (rows // size)
        # identity forward, all-reduce of the input gradient backward: each rank sees V/tp columns
        emb.project_input = copy_to_tensor_model_parallel_region


# ------------------------------------------------------------------------ 2. activation checkpointing


def apply_ac(model: Bloom) -> None:
    """Recompute each block's activations in the backward pass (non-reentrant
    ``torch.utils.checkpoint``): memory for compute. The block's ``forward`` is replaced on the
    instance, so names and ``__call__`` hooks (ZeRO-3's gathering) are untouched."""
    for block in model.blocks:
        inner = block.forward

        def forward(x: Any, _inner: Callable = inner) -> Any:
            if not torch.is_grad_enabled():
                return _inner(x)
            return torch.utils.checkpoint.checkpoint(_inner, x, use_reentrant=False)

        block.forward = forward  # type: ignore[method-assign]


def apply_compile(model: Bloom) -> None:
    """``torch.compile`` each block in place (``nn.Module.compile``: names, hooks and state_dict keys
    unchanged). Per block rather than the whole model, as torchtitan: the blocks are identical, so
    one compiled graph serves all of them, and pipeline stages hold whole blocks. Graph breaks are
    allowed (megatron-core's TP layers call collectives inside custom autograd functions)."""
    for block in model.blocks:
        block.compile()


# ------------------------------------------------------------------------------- materialisation


def build_on_device(
    module: nn.Module, prefix: str, source: Callable[[str], torch.Tensor], device: torch.device
) -> nn.Module:
    """Allocate a meta module on ``device`` and fill each parameter with this TP rank's slice of
    ``source(bloom_name)``; tag the sliced ones as megatron does (DeepSpeed's gradient norm sums
    them over TP ranks and counts replicated ones once)."""
    rank, size = tp_rank_and_size()
    module.to_empty(device=device)
    with torch.no_grad():
        for local, p in module.named_parameters():
            name = prefix + local
            rows = p.shape[0] * size if name == EMBEDDING else None
            p.copy_(tp_slice(name, source(name), rank, size, rows))
            dim = tp_dim(name)
            if size > 1 and dim is not None:
                from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

                for attr in ("tensor_model_parallel", "partition_dim", "partition_stride"):
                    if hasattr(p, attr):
                        delattr(p, attr)
                set_tensor_model_parallel_attributes(p, True, dim, 1)
    return module


# ---------------------------------------------------------------------------------- 3. pipeline


def _existing_spec(module: nn.Module, build: Callable[[], nn.Module], tied: bool = False, **kw: Any) -> Any:
    """A DeepSpeed layer spec for a module that already exists (on meta): DeepSpeed calls
    ``build()`` only on the stage that owns the layer, which materialises it there."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    base = TiedLayerSpec if tied else LayerSpec

    class Existing(base):  # type: ignore[misc, valid-type]
        def build(self, log: bool = False) -> nn.Module:
            return build()

    return Existing(TIED_KEY, type(module), **kw) if tied else Existing(type(module))


def _project(embedding: nn.Module, x: Any) -> torch.Tensor:
    return embedding(x, project=True)


# The layers balanced over pipeline stages: blocks and both copies of the tied embedding, as
# BLOOM's `--pp-partition-method 'type:transformer|embedding'` (tr11-176B-ml): the first and last
# stages, which hold the embedding and its optimizer states, get a block fewer. At 176B on 12
# stages that is 72 units, 6 per stage. training/planning/planner.py partitions the same way.
PARTITION_TYPES = "^(Block|Embedding)$"


def pipeline(
    model: Bloom, parallel: ParallelConfig, loss_fn: Callable, build: Callable[[str, nn.Module], nn.Module]
) -> nn.Module:
    """``Bloom.layers()`` and the tied output projection as a DeepSpeed ``PipelineModule``,
    partitioned by PARTITION_TYPES; ``build(name, module)`` materialises a layer on the stage
    that owns it."""
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    specs = []
    for name, layer in model.layers():

        def make(n: str = name, m: Any = layer) -> Any:
            return build(n, m)

        specs.append(
            _existing_spec(layer, make, tied=True, tied_weight_attr=["word_embeddings.weight"])
            if name == "embedding"
            else _existing_spec(layer, make)
        )
    specs.append(
        _existing_spec(
            model.embedding,
            lambda: build("embedding", model.embedding),
            tied=True,
            forward_fn=_project,
            tied_weight_attr=["word_embeddings.weight"],
        )
    )
    topo = PipeModelDataParallelTopology(num_pp=parallel.pp, num_mp=parallel.tp, num_dp=parallel.dp)
    return PipelineModule(
        layers=specs,
        topology=topo,
        loss_fn=loss_fn,
        partition_method=f"type:{PARTITION_TYPES}",
        activation_checkpoint_interval=0,  # done by apply_ac, the same at every layout
        dynamic_shape=True,
    )  # the bucket (sequence length) changes from step to step


# ---------------------------------------------------------------------------------- the entry point


def parallelize(
    model: Bloom,
    parallel: ParallelConfig,
    *,
    seed: int,
    dtype: torch.dtype,
    activation_checkpointing: bool,
    loss_fn: Callable,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    ds_config: dict[str, Any],
    device: torch.device,
    compile: bool = False,
    init: Optional[Callable[[str], torch.Tensor]] = None,
) -> Any:
    """Apply TP, activation checkpointing, PP and ZeRO to ``model`` at this rank's place in the
    (already initialised, ``training.parallel.distributed``) grid; returns the DeepSpeed engine.

    ``model`` must be on the meta device (built under ``torch.device("meta")``); its parameters
    are initialised as they are materialised, from ``init`` (the whole tensor of a parameter by
    name: existing weights, training/hf/from_hf.py) or else from ``seed``
    (``training.model.bloom.initial_value``)."""
    import deepspeed

    from training.parallel.layout import universal_info

    if model.embed_ln.weight.device.type != "meta":
        raise ValueError("parallelize() takes a Bloom built on the meta device; it materialises each rank's part")
    shapes = full_shapes(model.cfg)
    source = init or (lambda name: initial_value(name, shapes[name], model.cfg, seed))
    if parallel.tp > 1:
        apply_tp(model, megatron_config(parallel, dtype))  # 1
    if activation_checkpointing:
        apply_ac(model)  # 2
    if compile:
        apply_compile(model)
    build = lambda name, module: build_on_device(module, name + ".", source, device)  # noqa: E731
    if parallel.pp > 1:
        module = pipeline(model, parallel, loss_fn, build)  # 3
        mpu = None  # the PipelineModule's topology tells DeepSpeed the groups
    else:
        for name, layer in model.layers():
            build(name, layer)
        # without TP every rank is a replica: DeepSpeed's default groups (no mpu) are the layout's
        module, mpu = model, (DeepSpeedMPU() if parallel.tp > 1 else None)
    # Saved in every checkpoint: how DeepSpeed's universal converter merges this layout's TP slices.
    module.universal_checkpoint_info = universal_info(model.cfg, layout_of(parallel))
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        optimizer=make_optimizer(module),
        mpu=mpu,  # 4
        config=ds_config,
    )
    return engine
