"""Benchmark of the trainer on this machine (run by hand; prints figures).

    python -m bench.train_throughput [--steps 30] [--workdir /tmp/bloomline-train-bench]

Side by side, on shards prepared from ../shared/corpus (vocab 8000, buckets 64…512) and the
bloom-tiny architecture:

1. tokens/s of the trainer at TP=PP=DP=1 (DeepSpeed engine, bf16, real launcher; steps 3+
   averaged) vs a plain PyTorch loop of the same model (``training.model.bloom.Bloom``, AdamW,
   clipping) on the same batches — target ≥ 0.9×: like for like with bf16 weights and an fp32
   master copy (what DeepSpeed's BF16_Optimizer holds), and beside it the fp32-weights + bf16
   autocast loop. Activation checkpointing is off in all (it trades compute for memory).
   Beside them, the same plain bf16 loop on Megatron-LM's batches (tests/support/fixed_sampler.py: the
   documents concatenated and cut into full ``seq_len`` samples, a constant number per step,
   causal attention across documents), the fixed-batch alternative as Megatron runs it.
2. Batching over 200 steps at DP=2, dynamic vs Megatron-style: padding, the DP balance of the
   FLOPs the ``flex`` kernel computes for each rank (block masks; with ``sdpa`` all ranks compute
   the same dense work), and the share of causal (query, key) pairs that cross a document
   boundary (Megatron's batches attend them; bloomline's document mask leaves them out) — on the shards
   as bloomline packs them and on loosely packed shards (``pack.max_open_samples=1``).
3. MFU over this machine's measured bf16 matmul peak: the FLOPs the trainer's kernels computed
   (metrics.jsonl ``flops``: 6N per padded position + 12·L·H per computed attention pair,
   each step at its own bucket), and the dense-equivalent figure published runs report
   (6N + 12·L·H·T per real token, T the step's bucket), beside the old count (every step at
   seq_len).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from bench.repo import REPO, SHARED, cli
from bloomline.config import load_config, to_dict
from tests.support.fixed_sampler import MegatronBatches
from training.config import TrainRecipe


def prepare(wd: Path, name: str = "data", extra: list[str] = ()) -> Path:
    out = wd / name
    if not (out / "manifest.json").exists():
        settings = ["tokenizer.vocab_size=8000", "pack.buckets=[64,128,256,512]", "pack.valid_fraction=0.02", *extra]
        cli(
            "prepare",
            "--out",
            out,
            SHARED,
            "--config",
            REPO / "configs/data/demo.yaml",
            *[x for o in settings for x in ("-o", o)],
        )
    return out


def recipe(data: Path, steps: int, extra: list[str] = ()) -> TrainRecipe:
    vocab = json.loads((data / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    return load_config(
        TrainRecipe,
        REPO / "configs/train/bloom-tiny.yaml",
        [
            f"model.vocab_size={vocab}",
            f"train.steps={steps}",
            f"checkpoint.interval={steps + 1}",
            "train.activation_checkpointing=false",
            "batch.tokens_per_step=16384",
            "batch.micro_batch_tokens=4096",
            *extra,
        ],
    )


def trainer_tokens_per_s(data: Path, wd: Path, steps: int, extra: list[str] = (), run_name: str = "run") -> float:
    r = recipe(data, steps, extra)
    run = wd / run_name
    import shutil

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps(to_dict(r)))
    from training.loop.launch import launch_command

    cmd = launch_command(run / "recipe.json", str(data), str(run), 1)
    try:
        subprocess.run(
            cmd,
            cwd=REPO,
            check=True,
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    finally:
        from training.parallel.shm import release_job_shm

        release_job_shm(cmd)
    m = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()][2:]
    return sum(x["global_batch_tokens"] for x in m) / sum(x["step_seconds"] for x in m)


def plain_tokens_per_s(data: Path, steps: int, weights: str = "bf16", megatron: bool = False) -> float:
    """The same model, batches and optimizer in a plain PyTorch loop (no DeepSpeed).

    ``weights="bf16"`` is the like-for-like baseline: bf16 weights and gradients for compute and
    an fp32 master copy that AdamW updates, as DeepSpeed's BF16_Optimizer does (the trainer's
    setting). ``"autocast"`` keeps fp32 weights and runs the matmuls in bf16 under autocast,
    the common plain-PyTorch way, shown beside it. ``megatron``: Megatron-style batches of
    ``seq_len`` tokens (as many samples per step as the token budget holds, in micro-batches of
    ``micro_batch_tokens``) instead of bloomline's dynamic ones."""
    from training.data.sampler import DynamicBatchSampler
    from training.data.shard_reader import ShardIndex, collate
    from training.loop.ds_config import param_groups
    from training.model.bloom import IGNORE_INDEX, Bloom

    r = recipe(data, steps)
    model = Bloom(r.model, seed=r.train.seed)  # the trainer's initial weights (init by parameter name)
    if weights == "bf16":
        master = [p.detach().clone().float().requires_grad_() for p in model.parameters()]
        model.to(torch.bfloat16)
        groups = param_groups(model, r.optim.weight_decay)
        by_id = {id(p): m for p, m in zip(model.parameters(), master)}
        opt = torch.optim.AdamW(
            [{**g, "params": [by_id[id(p)] for p in g["params"]]} for g in groups],
            lr=r.optim.lr,
            betas=(r.optim.beta1, r.optim.beta2),
        )
    else:
        opt = torch.optim.AdamW(
            param_groups(model, r.optim.weight_decay), lr=r.optim.lr, betas=(r.optim.beta1, r.optim.beta2)
        )
    index = ShardIndex(data, "train")
    sampler = DynamicBatchSampler(index, r.batch, 1, r.model.seq_len, r.train.seed)
    seq, mbs = r.model.seq_len, max(1, r.batch.micro_batch_tokens // r.model.seq_len)
    mega = MegatronBatches(index, r.batch.tokens_per_step // seq, 1, seq, r.train.seed, mbs) if megatron else None
    pad = index.pad_id
    tokens = seconds = 0.0
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        if mega is not None:
            batches = [{k: v for k, v in b.items() if k != "doc_ids"} for b in mega.next_step()[0]]
            step_tokens = sum(b["input_ids"].numel() for b in batches)
        else:
            plan = sampler.next_step()
            batches = [collate(index, mb, plan.bucket, pad) for mb in plan.ranks[0]]
            step_tokens = plan.tokens
        n = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
        for b in batches:
            if weights == "bf16":
                logits = model(b["input_ids"], b["segment_ids"])
            else:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(b["input_ids"], b["segment_ids"])
            loss = (
                torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), b["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
                )
                / n
            )
            loss.backward()
        if weights == "bf16":
            for p, m in zip(model.parameters(), master):
                m.grad = p.grad.float()
                p.grad = None
            torch.nn.utils.clip_grad_norm_(master, r.optim.clip_grad)
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for p, m in zip(model.parameters(), master):
                    p.copy_(m)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), r.optim.clip_grad)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if step > 2:
            tokens += step_tokens
            seconds += time.perf_counter() - t0
    return tokens / seconds


def run_flops(run: Path, model: object) -> tuple[float, float]:
    """(FLOPs the kernels computed, dense-equivalent FLOPs of the real tokens) over the timed
    steps of the trainer's run: the first is the trainer's own count (metrics.jsonl ``flops``),
    the second 6N + 12·L·H·T per real token with T the step's bucket (PaLM's count, as
    published MFU figures use it)."""
    m = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()][2:]
    computed = sum(x["flops"] for x in m)
    real = sum(x["global_batch_tokens"] * model.flops_per_token(x["bucket"]) for x in m)  # type: ignore[attr-defined]
    return computed, real


def batching(data: Path, steps: int = 200, dp: int = 2) -> None:
    from training.data.sampler import DynamicBatchSampler
    from training.data.shard_reader import ShardIndex, collate
    from training.planning.flops import document_pairs, model_pair_weight, model_params, step_flops

    r = recipe(data, steps)
    m = r.model
    n_params = model_params(m)
    index = ShardIndex(data, "train")
    dyn = DynamicBatchSampler(index, r.batch, dp, m.seq_len, r.train.seed, pair_weight=model_pair_weight(m))
    mbs = max(1, r.batch.micro_batch_tokens // m.seq_len)
    mega = MegatronBatches(index, r.batch.tokens_per_step // (m.seq_len * dp), dp, m.seq_len, r.train.seed, mbs)

    def judge(ranks: list[list[dict]]) -> tuple[float, int, int, int, int]:
        flops = [sum(step_flops(rank, "flex", m.num_layers, m.hidden_size, n_params)) for rank in ranks]
        real = sum(int(b["lengths"].sum()) for rank in ranks for b in rank)
        padded = sum(b["input_ids"].numel() for rank in ranks for b in rank)
        causal = sum(int(n) * (int(n) + 1) // 2 for rank in ranks for b in rank for n in b["lengths"])
        inside = sum(
            document_pairs(np.flatnonzero(np.diff(d[:n].numpy(), prepend=0)), int(n))
            for rank in ranks
            for b in rank
            for d, n in zip(b.get("doc_ids", b["segment_ids"]), b["lengths"])
        )
        return max(flops) / np.mean(flops), real, padded, causal, inside

    for name, make in (
        (
            "dynamic (token budget, one bucket, balanced)",
            lambda: (lambda p: [[collate(index, mb, p.bucket, index.pad_id) for mb in rank] for rank in p.ranks])(
                dyn.next_step()
            ),
        ),
        (f"Megatron-style ({mega.per_rank} x {m.seq_len} tokens/rank, docs concatenated)", mega.next_step),
    ):
        rows = [judge(make()) for _ in range(steps)]
        bal = np.array([x[0] for x in rows])
        real, padded, causal, inside = (sum(x[i] for x in rows) for i in range(1, 5))
        print(
            f"{name:62s} padding {100 * (1 - real / padded):5.2f}%   DP balance of computed FLOPs (flex): mean "
            f"{bal.mean():.4f}, max {bal.max():.4f}, steps ≤1.02: {np.mean(bal <= 1.02) * 100:.0f}%   "
            f"causal pairs across documents: {100 * (1 - inside / causal):.1f}% "
            f"({'attended' if 'Megatron' in name else 'masked out'})"
        )


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


def setup(steps: int) -> tuple[argparse.Namespace, Path]:
    """The trainer benchmarks' command line (--steps, --workdir) and their shards."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-train-bench"))
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args, prepare(args.workdir)


def main() -> None:
    args, data = setup(30)
    print(f"threads: {torch.get_num_threads()}")
    t0 = time.perf_counter()
    ours = trainer_tokens_per_s(data, args.workdir, args.steps)
    ours_s = time.perf_counter() - t0
    plain = plain_tokens_per_s(data, args.steps, "bf16")
    auto = plain_tokens_per_s(data, args.steps, "autocast")
    print(f"trainer (DeepSpeed, TP=PP=DP=1, bf16 weights + fp32 master): {ours:,.0f} tokens/s")
    print(
        f"plain PyTorch loop, bf16 weights + fp32 master (like for like): {plain:,.0f} tokens/s   "
        f"ratio {ours / plain:.2f} (target ≥ 0.9)"
    )
    print(
        f"plain PyTorch loop, fp32 weights + bf16 autocast:             {auto:,.0f} tokens/s   ratio {ours / auto:.2f}"
    )
    mega = plain_tokens_per_s(data, args.steps, "bf16", megatron=True)
    print(
        f"plain PyTorch loop, bf16, Megatron-style batches (full seq_len, docs concatenated): {mega:,.0f} tokens/s   "
        f"ratio {ours / mega:.2f}"
    )
    print("batching on the shards as bloomline packs them:")
    batching(data)
    # A harder case for the balancer: shards packed with one open sample at a time, so samples
    # hold one or two documents and their lengths vary widely inside a bucket.
    loose = prepare(
        args.workdir,
        "data-loose",
        ["pack.max_open_samples=1", "tokenizer.model=" + str(data / "tokenizer" / "tokenizer.model")],
    )
    print("batching on loosely packed shards (pack.max_open_samples=1, lengths vary):")
    batching(loose)
    from training.model.bloom import Bloom

    r = recipe(data, 1)
    with torch.device("meta"):
        model = Bloom(r.model)
    fpt_max = model.flops_per_token(r.model.seq_len)
    computed, real = run_flops(args.workdir / "run", model)
    m = [json.loads(l) for l in (args.workdir / "run" / "metrics.jsonl").read_text().splitlines()][2:]
    secs = sum(x["step_seconds"] for x in m)
    peak = bf16_peak()
    print(
        f"bf16 matmul peak (2048³): {peak / 1e9:,.1f} GFLOP/s; model {fpt_max / 1e6:.1f} MFLOP/token at seq {r.model.seq_len}"
    )
    print(
        f"MFU of the trainer: {computed / secs / peak * 100:.1f}% counting the FLOPs its kernels computed (each "
        f"step at its own bucket, attention pairs as computed), {real / secs / peak * 100:.1f}% dense-equivalent "
        f"(real tokens x (6N + 12·L·H·bucket), as published MFU is counted)"
    )
    print(
        f"(the old figure, every step counted at seq {r.model.seq_len}: {fpt_max * ours / peak * 100:.1f}%; "
        f"trainer wall {ours_s:.0f} s)"
    )


if __name__ == "__main__":
    main()
