"""One rank of the parallel-equivalence test (tests/training/parallel/test_parallelize.py), started by the
DeepSpeed launcher: ``equivalence_worker.py --tp N --pp N --out DIR``.

Each rank builds the single-device reference ``Bloom(cfg, seed)`` and, from a meta-device Bloom
with the same seed, the parallel model through ``parallelize`` (real megatron-core TP layers,
real DeepSpeed PipelineModule and engine, activation checkpointing on). Both run the same batch
in fp32. The gradients DeepSpeed hands the optimizer (after its all-reduces: tied embedding
across stages, TP input gradients) are recorded by an optimizer with learning rate 0, and
compared with this rank's slice of the reference gradients. Writes ``DIR/rank_R.json``.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from training.config import ModelConfig, ParallelConfig
from training.loop.loss import StepLoss
from training.model.bloom import IGNORE_INDEX, Bloom, segment_ids_from_offsets
from training.parallel.distributed import init_distributed
from training.parallel.layout import EMBEDDING, bloom_name, tp_slice
from training.parallel.parallelize import parallelize

SEED = 17
# 300 pieces: 384 rows at TP=1, 512 at TP=2, so the TP layout pads the embedding further
CFG = ModelConfig(vocab_size=300, hidden_size=64, num_layers=4, num_heads=4, seq_len=32, init_std=0.02)


class RecordGrads(torch.optim.SGD):
    """An optimizer that only records the gradients it is given."""

    def __init__(self, module):
        super().__init__(module.parameters(), lr=0.0)
        self.grads: dict[int, torch.Tensor] = {}

    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    self.grads[id(p)] = p.grad.detach().clone()


def batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, CFG.vocab_size, (3, 32), generator=g)
    seg = segment_ids_from_offsets([[0, 9, 20], [0], [0, 13]], [32, 25, 30], 32)
    labels = torch.where(seg > 0, ids.roll(-1, dims=1), IGNORE_INDEX)
    labels[:, -1] = IGNORE_INDEX
    return ids, seg, labels


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--local_rank", type=int, default=0)
    args = ap.parse_args()
    parallel = ParallelConfig(tp=args.tp, pp=args.pp, dp=1, zero_stage=0, backend="gloo")
    mesh = init_distributed(parallel, SEED)
    ids, seg, labels = batch()
    n = int((labels != IGNORE_INDEX).sum())

    ref = Bloom(CFG, seed=SEED)
    ref_loss = Bloom.loss(ref(ids, seg), labels)
    ref_loss.backward()
    ref_grads = {name: p.grad for name, p in ref.named_parameters()}

    loss_fn = StepLoss()
    loss_fn.set_step(gas=1, dp=1, step_tokens=n)  # loss = token mean, as Bloom.loss
    with torch.device("meta"):
        model = Bloom(CFG)
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 0},
        "zero_allow_untested_optimizer": True,
        "pipeline": {"pipe_partitioned": False, "grad_partitioned": False},
        "steps_per_print": 10**9,
    }
    engine = parallelize(
        model,
        parallel,
        seed=SEED,
        dtype=torch.float32,
        activation_checkpointing=True,
        loss_fn=loss_fn,
        make_optimizer=RecordGrads,
        ds_config=ds_config,
        device=torch.device("cpu"),
    )
    if args.pp > 1:
        loss = float(engine.train_batch(data_iter=iter([((ids, seg), labels)])))
    else:
        out = engine(ids, seg)
        lv = loss_fn(out, labels)
        engine.backward(lv)
        engine.step()
        loss = float(lv)
    grads = engine.optimizer.grads
    errors = {}
    for local, p in engine.module.named_parameters():
        name = bloom_name(local, CFG.num_layers)
        rows = p.shape[0] * args.tp if name == EMBEDDING else None
        want = tp_slice(name, ref_grads[name], mesh.tp_rank, args.tp, rows)
        got = grads[id(p)]
        errors[local] = float((got - want).norm() / want.norm().clamp_min(1e-30))
    Path(args.out, f"rank_{mesh.rank}.json").write_text(
        json.dumps(
            {
                "loss": loss,
                "ref_loss": float(ref_loss),
                "grad_rel_errors": errors,
                "tp_rank": mesh.tp_rank,
                "pp_rank": mesh.pp_rank,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
