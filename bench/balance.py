"""Benchmark of the data-parallel load balance (run by hand; prints figures).

    python -m bench.balance [--steps 50] [--dp 4] [--workdir /tmp/bloomline-attn-bench]

The same steps drawn twice from shards packed from ../shared/corpus (buckets 256…2048, as
bench/attention.py prepares them; packed as bloomline packs, and loosely), dealt to ``--dp`` ranks
once by the sampler's balancer (cost model: padded length + w·Σ dᵢ(dᵢ+1)/2, w of bloom-560m) and
once round-robin (sample i to rank i mod dp). Both are judged by one real measure: the FLOPs the
``flex`` kernel computes for each rank's micro-batches, read off the block masks it runs with
(training/planning/flops.py), plus bloom-560m's linear FLOPs per padded position. Printed per dealing:
max/mean over ranks per step (mean and worst over steps) and the share of steps within 1.02.
With ``sdpa`` every rank computes the same dense work whatever the dealing (ratio 1.0).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bench.attention import packed_and_loose
from bench.repo import REPO, SHARED
from bloomline.config import load_config
from training.config import BatchConfig, ModelConfig


def rank_flops(index, plan, cfg: ModelConfig, n_params: int) -> np.ndarray:
    from training.data.shard_reader import collate
    from training.planning.flops import step_flops

    out = []
    for rank in plan.ranks:
        batches = [collate(index, mb, plan.bucket, index.pad_id) for mb in rank]
        out.append(sum(step_flops(batches, "flex", cfg.num_layers, cfg.hidden_size, n_params)))
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-attn-bench"))
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    from training.data.sampler import DynamicBatchSampler
    from training.data.shard_reader import ShardIndex
    from training.planning.flops import model_pair_weight, model_params

    args.workdir.mkdir(parents=True, exist_ok=True)
    packed, loose = packed_and_loose(args.workdir)
    cfg = load_config(ModelConfig, REPO / "configs/model/bloom-560m.yaml")
    n_params, w = model_params(cfg), model_pair_weight(cfg)
    batch = BatchConfig(tokens_per_step=args.dp * 4 * 4096, micro_batch_tokens=4096)
    print(
        f"dp={args.dp}, {batch.tokens_per_step:,} tokens per step, micro-batches of {batch.micro_batch_tokens} "
        f"tokens, {args.steps} steps; measure: FLOPs flex computes (block masks) + linear, bloom-560m"
    )
    for name, data in (("packed", packed), ("loose", loose)):
        index = ShardIndex(data, "train")
        for dealing in ("balanced", "round_robin"):
            s = DynamicBatchSampler(index, batch, args.dp, 2048, seed=1, pair_weight=w, dealing=dealing)
            ratios, model = [], []
            for _ in range(args.steps):
                plan = s.next_step()
                f = rank_flops(index, plan, cfg, n_params)
                ratios.append(f.max() / f.mean())
                model.append(plan.cost_balance)
            r = np.array(ratios)
            print(
                f"{name:6s} {dealing:11s}: computed max/mean per step: mean {r.mean():.4f}, worst {r.max():.4f}, "
                f"steps ≤1.02: {np.mean(r <= 1.02) * 100:5.1f}%   (cost model's own: mean {np.mean(model):.4f})"
            )


if __name__ == "__main__":
    main()
