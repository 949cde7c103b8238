"""Benchmark of the trainer on this machine (run by hand; prints figures).

    python bench/train_throughput.py [--steps 30] [--workdir /tmp/bloomline-train-bench]

Side by side, on shards prepared from ../shared/corpus (vocab 8000, buckets 64…512) and the
bloom-tiny architecture:

1. tokens/s of the trainer at TP=PP=DP=1 (DeepSpeed engine, bf16, real launcher; steps 3+
   averaged) vs a plain PyTorch loop of the same model (``training.model.Bloom``, bf16
   autocast, AdamW, clipping) on the same batches — target ≥ 0.9×. Activation checkpointing is
   off in both (it trades compute for memory, which would not compare like with like).
2. padding fraction of the dynamic batches and DP balance (max/mean estimated compute) over 200
   steps at DP=2, next to a fixed-sample-count baseline on the same data — targets < 1% and
   ≤ 1.02 — on the shards as bloomline packs them (nearly every sample full) and on loosely
   packed shards whose sample lengths vary (the case the balancer is for).
3. MFU: model FLOPs/token (6N + 12·L·H·T) × tokens/s over this machine's measured bf16 matmul peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpus"
sys.path.insert(0, str(REPO))

from bloomline.config import load_config, to_dict  # noqa: E402
from training.config import TrainRecipe  # noqa: E402


def prepare(wd: Path, name: str = "data", extra: list[str] = ()) -> Path:
    out = wd / name
    if not (out / "manifest.json").exists():
        cmd = [sys.executable, "-m", "flows.cli", "prepare", "--out", str(out), str(SHARED),
               "-o", "tokenizer.vocab_size=8000", "-o", "pack.buckets=[64,128,256,512]", "-o", "pack.valid_fraction=0.02"]
        for o in extra:
            cmd += ["-o", o]
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def recipe(data: Path, steps: int, extra: list[str] = ()) -> TrainRecipe:
    vocab = json.loads((data / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    return load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml",
                       [f"model.vocab_size={vocab}", f"train.steps={steps}", f"checkpoint.interval={steps + 1}",
                        "train.activation_checkpointing=false", "batch.tokens_per_step=16384",
                        "batch.micro_batch_tokens=4096", *extra])


def trainer_tokens_per_s(data: Path, wd: Path, steps: int) -> float:
    r = recipe(data, steps)
    run = wd / "run"
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps(to_dict(r)))
    from training.launch import launch_command

    cmd = launch_command(run / "recipe.json", str(data), str(run), 1)
    try:
        subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, "DS_ACCELERATOR": "cpu"},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        from training.shm import release_job_shm

        release_job_shm(cmd)
    m = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()][2:]
    return sum(x["global_batch_tokens"] for x in m) / sum(x["step_seconds"] for x in m)


def plain_tokens_per_s(data: Path, steps: int) -> float:
    """The same model, batches and optimizer in a plain PyTorch loop (no DeepSpeed)."""
    from training.data import ShardIndex, materialize
    from training.model import IGNORE_INDEX, Bloom
    from training.sampler import DynamicBatchSampler
    from training.trainer import param_groups

    r = recipe(data, steps)
    model = Bloom(r.model, seed=r.train.seed)  # the trainer's initial weights (init by parameter name)

    opt = torch.optim.AdamW(param_groups(model, r.optim.weight_decay), lr=r.optim.lr, betas=(r.optim.beta1, r.optim.beta2))
    index = ShardIndex(data, "train")
    sampler = DynamicBatchSampler(index, r.batch, 1, r.model.seq_len, r.train.seed)
    pad = index.pad_id
    tokens = seconds = 0.0
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        plan = sampler.next_step()
        batches = [materialize(index, mb, plan.bucket, pad) for mb in plan.ranks[0]]
        n = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
        for b in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(b["input_ids"], b["segment_ids"])
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), b["labels"].flatten(),
                                                     ignore_index=IGNORE_INDEX, reduction="sum") / n
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.optim.clip_grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step > 2:
            tokens += plan.tokens
            seconds += time.perf_counter() - t0
    return tokens / seconds


def batching(data: Path, steps: int = 200, dp: int = 2) -> None:
    from bench.fixed_sampler import FixedBatchSampler
    from training.data import ShardIndex
    from training.sampler import DynamicBatchSampler

    r = recipe(data, steps)
    index = ShardIndex(data, "train")
    dyn = DynamicBatchSampler(index, r.batch, dp, r.model.seq_len, r.train.seed)
    plans = [dyn.next_step() for _ in range(steps)]
    per_rank = int(np.mean([p.gas * p.micro_batch_size for p in plans]))
    fixed = FixedBatchSampler(index, per_rank, dp, r.train.seed, seq_len=r.model.seq_len,
                              attn_weight=r.batch.attn_weight)
    fplans = [fixed.next_step() for _ in range(steps)]
    for name, ps in (("dynamic (token budget, one bucket, balanced)", plans),
                     (f"fixed baseline ({per_rank} samples/rank, padded to longest)", fplans)):
        pad = 1 - sum(p.tokens for p in ps) / sum(p.padded_tokens for p in ps)
        bal = [p.dp_balance for p in ps]
        print(f"{name:58s} padding {100 * pad:6.2f}%   DP balance max/mean: mean {np.mean(bal):.4f}, "
              f"max {np.max(bal):.4f}, steps ≤1.02: {np.mean(np.array(bal) <= 1.02) * 100:.0f}%")


def bf16_peak() -> float:
    a = torch.randn(2048, 2048, dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        a @ b
    return 2 * 2048**3 * n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-train-bench"))
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = prepare(args.workdir)
    print(f"threads: {torch.get_num_threads()}")
    ours = trainer_tokens_per_s(data, args.workdir, args.steps)
    plain = plain_tokens_per_s(data, args.steps)
    print(f"trainer (DeepSpeed, TP=PP=DP=1, bf16): {ours:,.0f} tokens/s")
    print(f"plain PyTorch loop, same model/batches: {plain:,.0f} tokens/s   ratio {ours / plain:.2f} (target ≥ 0.9)")
    print("batching on the shards as bloomline packs them:")
    batching(data)
    # A harder case for the balancer: shards packed with one open sample at a time, so samples
    # hold one or two documents and their lengths vary widely inside a bucket.
    loose = prepare(args.workdir, "data-loose", ["pack.max_open_samples=1", "tokenizer.model=" +
                                                 str(data / "tokenizer" / "tokenizer.model")])
    print("batching on loosely packed shards (pack.max_open_samples=1, lengths vary):")
    batching(loose)
    from training.model import Bloom

    r = recipe(data, 1)
    with torch.device("meta"):
        fpt = Bloom(r.model).flops_per_token(r.model.seq_len)
    peak = bf16_peak()
    print(f"bf16 matmul peak (2048³): {peak / 1e9:,.1f} GFLOP/s; model {fpt / 1e6:.1f} MFLOP/token")
    print(f"MFU: trainer {fpt * ours / peak * 100:.1f}%, plain loop {fpt * plain / peak * 100:.1f}%")


if __name__ == "__main__":
    main()
