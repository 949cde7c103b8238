"""Plan a training layout before renting the machines: memory per pipeline stage and GPU, FLOPs,
the pipeline bubble, and whether it fits (``bloomline plan``).

Every figure is a formula over the recipe; the sources:

* **Parameters per stage** come from the model itself (a meta-device ``Bloom``), cut over TP by
  the same rules as the trainer (training/parallel/layout.py) and over PP stages by DeepSpeed's own
  ``partition_balanced`` with the trainer's partition method (training/parallel/parallelize.py): the tied
  embedding sits on the first *and* the last stage, with its gradients and optimizer states.
* **Model states** (bytes per parameter; Rajbhandari et al. 2020, ZeRO, §3 with K = 12 for
  Adam's fp32 master weights, momentum and variance), P parameters on this GPU, D = DP:
    - bf16 with ZeRO-1: DeepSpeed's BF16_Optimizer, what DeepSpeed picks for bf16 + ZeRO-1 today
      and what BLOOM ran (its DeepSpeed config said stage 0: "bf16 must use z0! it implements its
      own zero stage 1 equivalent"): bf16 weights 2 + bf16 gradients 2 + fp32 gradient
      accumulation 4, then the 12 optimizer bytes partitioned: 8 + 12/D;
    - ZeRO-0: 16 (weights 2, gradients 2, optimizer 12, nothing partitioned);
    - ZeRO-2: 2 + (2 + 4 + 12)/D, as DeepSpeed's ``estimate_zero2_model_states_mem_needs`` counts;
    - ZeRO-3: (2 + 2 + 4 + 12)/D plus the largest layer gathered (4 bytes per parameter of it);
    - fp32 training: 4-byte weights and gradients, no master copy: 8 + 8/D at ZeRO-1.
* **Activations** per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 2 / Table 2, tensor parallelism without
  sequence parallelism, 16-bit activations): s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes; with full
  checkpointing each layer keeps only its 16-bit input, 2·s·b·h bytes, and one layer at a time is
  recomputed to its full size during backward. Under 1F1B the first stage holds p micro-batches
  in flight (stage i: p − i, at most m), each also in one pipeline output buffer (2·s·b·h).
* **Logits** on the last stage: s·b·V/t elements as bf16 (2 bytes), their fp32 copy (4) and the
  fp32 gradient of the cross-entropy (4), as training/loop/loss.py computes it.
* **FLOPs per iteration** (Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", eq. 3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))
  with activation recomputation (one extra forward pass); 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
  without. TFLOP/s per GPU = FLOPs / (iteration seconds · GPUs), as BLOOM's logs computed it.
* **Bubble** (ibid., §2.2.1): (p − 1)/m, m micro-batches per pipeline per iteration.
* **ZeRO-Offload** (Ren et al. 2021): the fp32 master weights, Adam states and fp32 gradients
  (16 bytes per parameter of the DP partition) live in CPU memory; per iteration each GPU sends
  its bf16 gradient partition down and receives the updated bf16 weights (2 + 2 bytes per
  parameter of the partition) over PCIe.
* **Overhead**: CUDA context, NCCL buffers and the caching allocator's slack, one constant per
  GPU (``OVERHEAD_GIB``), calibrated on BLOOM-176B's published memory (see its comment).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

GIB = 1024**3

# CUDA context (~0.5 GiB), NCCL's communicators and buffers for the TP, PP and DP groups, and
# the PyTorch caching allocator's reserved-but-free memory: one constant, calibrated on
# BLOOM-176B. nvidia-smi showed about 59 GB at MBS 2 and 73 GB at MBS 4 on the first node
# (tr11-176B-ml chronicles); the modelled terms give 45.1 and 54.9 GiB for stage 0 there, and
# 5 GiB brings them to 50.1 and 59.9 GiB (-15% and -18%, read as GiB; -9% and -12% if nvidia-smi's
# figures were GB), inside the ±25% asked, without fitting any activation term to them. That the
# gap grows with the micro-batch says activations carry more than Korthikanti's count
# (allocator slack on the recomputed layer's temporaries); the plan errs on the low side there.
# Checked on a run it was not fitted on: BigScience's 52B GPT-2 trial on V100-32GB (TP 4 × PP 16,
# ZeRO 0, fp16), stage 0 reserved 22,892 MiB plus a 1,113 MiB CUDA context = 23.4 GiB; the plan
# gives 24.2 GiB (+3%), 19.2 GiB without this constant (-18%) (tests/training/planning/test_planner.py).
OVERHEAD_GIB = 5.0


@dataclass(frozen=True)
class Device:
    name: str
    memory_gib: float
    """What the framework can allocate (nvidia-smi's total)."""
    bf16_tflops: Optional[float]
    """Dense peak (vendor datasheet)."""
    pcie_gb_s: Optional[float]
    """Host link per direction, achievable (about 80% of the link's nominal rate)."""
    per_node: int = 8
    overhead_gib: float = OVERHEAD_GIB


DEVICES: dict[str, Device] = {
    # 24 GB. A10: 23028 MiB, 125 TFLOP/s bf16 dense; L4: 23034 MiB, 121 (datasheets: twice that with
    # sparsity); both PCIe 4.0 x16
    "a10-24gb": Device("NVIDIA A10", 22.5, 125.0, 25.0),
    "l4-24gb": Device("NVIDIA L4", 22.5, 121.0, 25.0),
    # 40 GB. A100 SXM4 40GB: 40960 MiB, 312 TFLOP/s bf16 dense, PCIe 4.0 x16
    "a100-40gb": Device("NVIDIA A100-SXM4-40GB", 40.0, 312.0, 25.0),
    # 48 GB. A40: 46068 MiB, 149.7 TFLOP/s bf16 dense; L40S: 46068 MiB, 362; RTX A6000: 49140 MiB,
    # 154.8; all PCIe 4.0 x16
    "a40-48gb": Device("NVIDIA A40", 45.0, 149.7, 25.0),
    "l40s-48gb": Device("NVIDIA L40S", 45.0, 362.0, 25.0),
    "a6000-48gb": Device("NVIDIA RTX A6000", 48.0, 154.8, 25.0),
    # 80 GB. A100 SXM4 80GB: 81920 MiB, 312 TFLOP/s bf16 dense, PCIe 4.0 x16 (32 GB/s nominal)
    "a100-80gb": Device("NVIDIA A100-SXM4-80GB", 80.0, 312.0, 25.0),
    # H100 SXM5 80GB: 81559 MiB, 989 TFLOP/s bf16 dense, PCIe 5.0 x16 (64 GB/s nominal)
    "h100-80gb": Device("NVIDIA H100-SXM5-80GB", 79.6, 989.0, 50.0),
    # H200 SXM 141GB: 143771 MiB, 989 TFLOP/s bf16 dense, PCIe 5.0 x16
    "h200": Device("NVIDIA H200 141GB", 140.4, 989.0, 50.0),
}


def cpu_device() -> Device:
    """This machine as one "device": its RAM shared by the ranks (per_node = its cores)."""
    import os

    import psutil

    return Device(
        "CPU (this machine)",
        psutil.virtual_memory().total / GIB,
        None,
        None,
        per_node=len(os.sched_getaffinity(0)),
        overhead_gib=0.5,
    )  # torch + DeepSpeed per rank, measured ~0.4 GiB


@dataclass
class StagePlan:
    stage: int
    blocks: int
    embedding: bool
    params: int
    """Parameters on one GPU of this stage (its TP slice)."""
    parts_gib: dict[str, float] = field(default_factory=dict)
    activations_without_checkpointing_gib: float = 0.0
    memory_gib: float = 0.0
    offload_memory_gib: Optional[float] = None
    """With ZeRO-Offload: the same stage, optimizer states in CPU memory."""


def model_state_bytes(precision: str, zero_stage: int, dp: int) -> dict[str, float]:
    """Bytes per parameter on one GPU: weights, gradients, optimizer (see the module docstring)."""
    if precision == "fp32":
        return {
            "weights": 4.0,
            "gradients": 4.0 / (dp if zero_stage >= 2 else 1),
            "optimizer": 8.0 / (dp if zero_stage >= 1 else 1),
        }
    if zero_stage == 0:
        return {"weights": 2.0, "gradients": 2.0, "optimizer": 12.0}
    if zero_stage == 1:  # BF16_Optimizer: fp32 gradient accumulation kept whole on every rank
        return {"weights": 2.0, "gradients": 2.0 + 4.0, "optimizer": 12.0 / dp}
    if zero_stage == 2:
        return {"weights": 2.0, "gradients": 6.0 / dp, "optimizer": 12.0 / dp}
    return {"weights": 2.0 / dp, "gradients": 6.0 / dp, "optimizer": 12.0 / dp}


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int) -> float:
    """Korthikanti et al. 2022, eq. 2 with tensor parallelism t (no sequence parallelism)."""
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def flops_per_iteration(batch: int, s: int, layers: int, h: int, vocab: int, recompute: bool) -> float:
    """Narayanan et al. 2021, eq. 3 (and its no-recompute form)."""
    if recompute:
        return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    return 72 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))


def stage_layout(model_cfg: Any, pp: int) -> list[tuple[int, int]]:
    """[start, stop) of each stage over the pipeline layers, as the trainer partitions them:
    DeepSpeed's ``partition_balanced`` over the trainer's partition method's layer weights."""
    from deepspeed.runtime.utils import partition_balanced

    from training.parallel.layout import pipeline_prefixes
    from training.parallel.parallelize import PARTITION_TYPES

    names = [layer_type(p) for p in pipeline_prefixes(model_cfg.num_layers)]
    weights = [1 if re.search(PARTITION_TYPES, n, re.IGNORECASE) else 0 for n in names]
    parts = partition_balanced(weights=weights, num_parts=pp)
    return [(parts[i], parts[i + 1]) for i in range(pp)]


def layer_type(prefix: str) -> str:
    """The class name of a pipeline layer (training/model/bloom.py) from its Bloom name."""
    from training.model.bloom import Block, Embedding, LayerNorm

    return (Block if prefix.startswith("blocks.") else Embedding if prefix == "embedding" else LayerNorm).__name__


def stage_params(model_cfg: Any, tp: int, bounds: tuple[int, int]) -> tuple[int, int, bool]:
    """(parameters on one GPU of the stage, its blocks, whether it holds the embedding)."""
    from training.model.bloom import full_shapes
    from training.parallel.layout import EMBEDDING, pipeline_prefixes, tp_dim

    shapes = full_shapes(model_cfg)
    # dict.fromkeys: with one stage, the tied projection is the embedding itself, held once
    prefixes = list(dict.fromkeys(pipeline_prefixes(model_cfg.num_layers)[bounds[0] : bounds[1]]))
    total, blocks, emb = 0, 0, False
    for prefix in prefixes:
        blocks += prefix.startswith("blocks.")
        for name, shape in shapes.items():
            if not name.startswith(prefix + "."):
                continue
            if name == EMBEDDING:
                emb = True
                total += model_cfg.padded_vocab(tp) * model_cfg.hidden_size // tp
                continue
            n = math.prod(shape)
            total += n // tp if tp_dim(name) is not None else n
    return total, blocks, emb


def plan(
    recipe: Any,
    device: Device,
    nodes: Optional[int] = None,
    iteration_seconds: Optional[float] = None,
    offload: bool = False,
) -> dict[str, Any]:
    """The plan of ``recipe`` (a resolved TrainRecipe) on ``device``; see the module docstring."""
    m, par, r = recipe.model, recipe.parallel, recipe.train
    tp, pp, dp, zero = par.tp, par.pp, par.dp, par.zero_stage
    if nodes is not None:
        gpus = nodes * device.per_node
        if gpus % (tp * pp):
            return _refuse(
                recipe,
                device,
                f"{nodes} node(s) × {device.per_node} = {gpus} devices is not a multiple of tp·pp = {tp * pp}",
            )
        dp = gpus // (tp * pp)
    world = tp * pp * dp
    s = m.seq_len
    mbs = max(recipe.batch.micro_batch_tokens // s, 1)
    gbs = max(recipe.batch.tokens_per_step // s, 1)
    micro = max(gbs // (mbs * dp), 1)  # micro-batches per pipeline per iteration
    ckpt = r.activation_checkpointing
    state = model_state_bytes(r.precision, zero, dp)
    offloaded = par.offload_optimizer == "cpu"  # the recipe's own ZeRO-Offload: planned as it runs
    offload = offload or offloaded
    stages = stage_plans(m, r, (tp, pp, zero), micro, mbs, state, device, offload)

    fits, reason = _fit(stages, device, offloaded)
    flops = flops_per_iteration(gbs, s, m.num_layers, m.hidden_size, m.padded_vocab(tp), ckpt)
    out: dict[str, Any] = {
        **_model_and_layout(m, tp, pp, dp, zero, device),
        "device": asdict(device),
        "precision": r.precision,
        "activation_checkpointing": ckpt,
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "micro_batches": micro,
        "fits": fits,
        "reason": reason,
        "stages": [asdict(x) for x in stages],
        "bytes_per_param": state,
        "flops_per_iteration": flops,
        "bubble": (pp - 1) / micro,
    }
    if iteration_seconds:
        out["iteration_seconds"] = iteration_seconds
        out["tflops_per_gpu"] = flops / (iteration_seconds * world) / 1e12
        if device.bf16_tflops:
            out["mfu"] = out["tflops_per_gpu"] / device.bf16_tflops
    if offload:
        out["offload"] = offload_costs(stages, state, dp, device, zero, out.get("iteration_seconds"), world)
    out["deepspeed_estimate"] = deepspeed_estimates(stages, dp, largest_layer(m, tp))
    return out


def stage_plans(
    m: Any,
    r: Any,
    par: tuple[int, int, int],
    micro: int,
    mbs: int,
    state: dict[str, float],
    device: Device,
    offload: bool,
) -> list[StagePlan]:
    """Each pipeline stage's memory by part (model state, activations, pipeline buffers, logits,
    overhead) at ``par`` = (tp, pp, zero_stage), ``micro`` micro-batches of ``mbs`` samples."""
    tp, pp, zero = par
    s, h, a = m.seq_len, m.hidden_size, m.num_heads
    V = m.padded_vocab(tp)
    ckpt = r.activation_checkpointing
    act_bytes = 2 if r.precision in ("bf16", "fp16") else 4
    full_layer = layer_activation_bytes(s, mbs, h, a, tp) * act_bytes / 2
    kept_layer = 2 * s * mbs * h * act_bytes / 2

    stages = []
    for i, bounds in enumerate(stage_layout(m, pp)):
        params, blocks, emb = stage_params(m, tp, bounds)
        in_flight = min(pp - i, micro)
        parts = {k: params * v / GIB for k, v in state.items()}
        if zero == 3:  # the largest layer (the MLP's h → 4h weight) gathered whole, as DeepSpeed counts it
            parts["weights"] += 4 * largest_layer(m, tp) / GIB
        stored = blocks * (kept_layer if ckpt else full_layer) * in_flight + (full_layer if ckpt and blocks else 0)
        parts["activations"] = stored / GIB
        parts["pipeline_buffers"] = (in_flight * kept_layer / GIB) if pp > 1 else 0.0
        parts["logits"] = (s * mbs * V / tp * (2 + 4 + 4) / GIB) if i == pp - 1 else 0.0
        parts["overhead"] = device.overhead_gib
        st = StagePlan(
            i,
            blocks,
            emb,
            params,
            {k: round(v, 3) for k, v in parts.items()},
            round(blocks * full_layer * in_flight / GIB, 3),
            round(sum(parts.values()), 3),
        )
        if offload:
            st.offload_memory_gib = round(
                st.memory_gib - params * (state["optimizer"] + state["gradients"] - 2.0) / GIB
                if zero <= 2
                else st.memory_gib - params * state["optimizer"] / GIB,
                3,
            )
        stages.append(st)

    return stages


def largest_layer(m: Any, tp: int) -> int:
    """Parameters of the largest single weight on one GPU: the MLP's h → 4h projection."""
    return m.ffn_mult * m.hidden_size * m.hidden_size // tp


def _model_and_layout(m: Any, tp: int, pp: int, dp: int, zero: int, device: Device) -> dict[str, Any]:
    """The plan's ``model`` (its size and shape, the vocabulary padded for TP) and ``layout``
    (the parallel sizes, the devices and nodes they take) parts."""
    from training.model.bloom import full_shapes

    world = tp * pp * dp
    return {
        "model": {
            "params": sum(math.prod(x) for x in full_shapes(m).values()),
            "layers": m.num_layers,
            "hidden": m.hidden_size,
            "heads": m.num_heads,
            "vocab_padded": m.padded_vocab(tp),
            "seq_len": m.seq_len,
        },
        "layout": {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "zero_stage": zero,
            "world": world,
            "nodes": math.ceil(world / device.per_node),
            "per_node": device.per_node,
        },
    }


def _fit(stages: list[StagePlan], device: Device, offloaded: bool = False) -> tuple[bool, str]:
    """Whether the fullest stage fits ``device``, and why: what it needs, or its three largest
    parts; with the recipe's optimizer ``offloaded`` to CPU memory, what stays on the device."""

    def need(x: StagePlan) -> float:
        return x.offload_memory_gib if offloaded and x.offload_memory_gib is not None else x.memory_gib

    st = max(stages, key=need)
    with_ = " with the optimizer in CPU memory" if offloaded else ""
    if need(st) <= device.memory_gib:
        return True, f"fits: the fullest stage ({st.stage}) needs {need(st):.1f} of {device.memory_gib:.1f} GiB{with_}"
    top = sorted(st.parts_gib.items(), key=lambda kv: -kv[1])[:3]
    return False, (
        f"does not fit: stage {st.stage} needs {need(st):.1f} GiB per device{with_}, more than the "
        f"{device.memory_gib:.1f} GiB of a {device.name} (" + ", ".join(f"{k} {v:.1f}" for k, v in top) + " GiB)"
    )


def _refuse(recipe: Any, device: Device, reason: str) -> dict[str, Any]:
    return {
        "fits": False,
        "reason": reason,
        "stages": [],
        "flops_per_iteration": None,
        "bubble": None,
        "device": asdict(device),
    }


def offload_costs(
    stages: list[StagePlan],
    state: dict[str, float],
    dp: int,
    device: Device,
    zero: int,
    iteration_seconds: Optional[float],
    world: Optional[int] = None,
) -> dict[str, Any]:
    """ZeRO-Offload of the fullest stage: GPU memory freed, CPU memory per node (for the node's
    ranks: ``world`` of them, or a full node's), PCIe traffic."""
    worst = max(stages, key=lambda x: x.memory_gib)
    part = worst.params / dp  # parameters of this GPU's DP partition
    pcie_bytes = (2 + 2) * part
    out = {
        "gpu_freed_gib": round(worst.memory_gib - (worst.offload_memory_gib or worst.memory_gib), 3),
        "cpu_gib_per_device": round(16 * part / GIB, 3),
        "cpu_gib_per_node": round(16 * part * min(world or device.per_node, device.per_node) / GIB, 3),
        "pcie_gib_per_iteration_per_device": round(pcie_bytes / GIB, 3),
    }
    if device.pcie_gb_s:
        out["pcie_seconds_per_iteration"] = round(pcie_bytes / (device.pcie_gb_s * 1e9), 3)
        if iteration_seconds:
            out["pcie_share_of_iteration"] = round(out["pcie_seconds_per_iteration"] / iteration_seconds, 4)
    return out


def deepspeed_estimates(stages: list[StagePlan], dp: int, largest: int) -> dict[str, Any]:
    """DeepSpeed's own model-state estimators on the fullest stage's parameters, its DP group as
    the GPUs sharing them. They agree with ours at ZeRO-2 (2 + 18/D bytes per parameter); at
    ZeRO-3 they leave out the 16-bit weights' own partition (2/D); neither covers ZeRO-1's
    BF16_Optimizer, whose whole fp32 gradient-accumulation buffer (4 bytes) ZeRO-2 would partition."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    worst = max(stages, key=lambda x: x.memory_gib)
    _, z2 = estimate_zero2_model_states_mem_needs(worst.params, num_gpus_per_node=dp, num_nodes=1, cpu_offload=False)
    _, z3, _ = estimate_zero3_model_states_mem_needs(
        worst.params, largest, num_gpus_per_node=dp, num_nodes=1, cpu_offload=False
    )
    ours2 = worst.params * sum(model_state_bytes("bf16", 2, dp).values())
    ours3 = worst.params * sum(model_state_bytes("bf16", 3, dp).values()) + 4 * largest
    return {
        "stage": worst.stage,
        "zero2_gib": round(z2 / GIB, 3),
        "zero2_ours_gib": round(ours2 / GIB, 3),
        "zero3_gib": round(z3 / GIB, 3),
        "zero3_ours_gib": round(ours3 / GIB, 3),
    }
