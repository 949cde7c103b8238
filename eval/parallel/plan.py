"""The smallest evaluation layout that fits a model on a device (``bloomline plan`` prints it).

An evaluation holds no gradients or optimizer states: a rank holds its stage's TP slice of the
weights (stages cut as training cuts them, training/planning/planner.py ``stage_params``) in the
evaluation's precision, and, one layer at a time, the activations of one batch of
``batch_tokens`` tokens (N) at the model's sequence length s, in that precision (w bytes):

* the block's input, output and LayerNorm outputs, 4·N·h·w; its q, k, v, 3·N·h/t·w;
* attention with the explicit ALiBi and document bias (training/model/bloom.py ``attention_bias``,
  the ``sdpa`` kernel): the bias, the scores and their softmax, each [N/s, a/t, s, s], 3·N·(a/t)·s·w;
* the MLP's 4h/t columns and their GeLU, 8·N·h/t·w;

and on the last stage the batch's logits over its V/t vocabulary columns, in w bytes, their fp32
copy and the fp32 exponentials of the log-sum-exp (eval/parallel/ranks.py), N·V/t·(w + 8);
plus the device's constant overhead (CUDA context, communicators, allocator slack:
``Device.overhead_gib``). Generation's key-value caches (a few prompts of tens of tokens) are
negligible beside these.

The search: one device when the model fits one; else the fewest nodes, and on them the most TP
(the divisors of the heads up to a node's devices), then the fewest stages: a pipeline's stages
run one after another for a single driver, while TP divides every layer's time, and devices of a
node left idle cost the same as used ones.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

from training.planning.planner import GIB, Device, stage_layout, stage_params


@dataclass
class EvalStage:
    stage: int
    blocks: int
    embedding: bool
    params: int
    """Parameters on one rank of this stage."""
    weights_gib: float
    activations_gib: float
    logits_gib: float
    memory_gib: float


def eval_stages(m: Any, tp: int, pp: int, batch_tokens: int, dtype_bytes: int, device: Device) -> list[EvalStage]:
    """Memory per rank of each stage of a tp × pp evaluation (module docstring)."""
    s, h, a = m.seq_len, m.hidden_size, m.num_heads
    n = max(batch_tokens // s, 1) * s  # whole sequences, as the validation task batches them
    w = dtype_bytes
    layer = n * h * w * (4 + 3 / tp + 8 / tp) + 3 * n * (a / tp) * s * w
    out = []
    bounds = stage_layout(m, pp)
    for i, b in enumerate(bounds):
        params, blocks, emb = stage_params(m, tp, b)
        last = i == pp - 1
        logits = n * m.padded_vocab(tp) / tp * (w + 8) if last else 0.0
        act = layer if blocks else n * h * w * 2
        total = params * w + act + logits
        out.append(
            EvalStage(
                i, blocks, emb, params, params * w / GIB, act / GIB, logits / GIB, total / GIB + device.overhead_gib
            )
        )
    return out


def eval_plan(m: Any, device: Device, batch_tokens: int, precision: str = "bf16") -> dict[str, Any]:
    """The evaluation layout to propose for model ``m`` (a ModelConfig) on ``device``: ``fits``,
    ``tp``, ``pp``, ``world``, ``nodes``, ``stages`` (:class:`EvalStage` as dicts) and ``reason``."""
    w = {"bf16": 2, "fp16": 2, "fp32": 4}[precision]
    tps = [t for t in range(1, device.per_node + 1) if m.num_heads % t == 0 and m.hidden_size % t == 0]

    def fits(tp: int, pp: int) -> Optional[list[EvalStage]]:
        stages = eval_stages(m, tp, pp, batch_tokens, w, device)
        return stages if max(st.memory_gib for st in stages) <= device.memory_gib else None

    best: Optional[tuple[int, int, list[EvalStage]]] = None
    one = fits(1, 1)
    if one:
        best = (1, 1, one)
    for nodes in range(1, math.ceil(m.num_layers * max(tps) / device.per_node) + 1):
        if best:
            break
        for tp in sorted(tps, reverse=True):
            pp = next((p for p in range(1, min(m.num_layers, nodes * device.per_node // tp) + 1) if fits(tp, p)), None)
            if pp is not None:
                best = (tp, pp, fits(tp, pp))  # type: ignore[assignment]
                break
    if best is None:
        return {"fits": False, "reason": f"no layout of up to {m.num_layers} stages fits {device.name}", "stages": []}
    tp, pp, stages = best
    worst = max(stages, key=lambda st: st.memory_gib)
    return {
        "fits": True,
        "tp": tp,
        "pp": pp,
        "world": tp * pp,
        "nodes": math.ceil(tp * pp / device.per_node),
        "precision": precision,
        "batch_tokens": batch_tokens,
        "stages": [asdict(st) for st in stages],
        "reason": f"the fullest rank (stage {worst.stage}) needs {worst.memory_gib:.1f} of {device.memory_gib:.1f} GiB",
    }
