"""Benchmark of the per-language evaluation (run by hand; prints figures).

    python -m bench.eval_throughput [--workdir /tmp/bloomline-eval-bench] [--steps 60]

On shards prepared from ../shared/corpus (vocab 8000, buckets 64…512) and bloom-tiny:

1. Evaluation tokens/s (``eval.publish.evaluate_model``: collation, forward, per-token NLL, byte
   and document accounting) against the trainer's forward pass on the same batches (collation,
   the model's forward and the trainer's loss, ``training.loop.loss.token_losses``; no backward) —
   target ≥ 0.9×; fp32 and bf16. (At bloom-tiny's size the vocabulary's log-softmax costs about
   as much as the rest of the forward, so a forward without any loss is no fair comparison.)
2. Wall time of one full per-language evaluation of a checkpoint (``eval.publish.evaluate``:
   load, verify, every language's whole validation split, generations).
3. How much the automatic evaluation slows training: ``bloomline train`` for the same steps
   with ``evaluation.enabled=false``, with the default (the watcher in Linux's idle scheduling
   class, one thread), at nice 10 only, and at nice 0 with two threads, on this 2-core machine:
   training tokens/s over the steps after the first checkpoint, the slowest step, and when the
   evaluations finished relative to the end of training.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from bench.repo import REPO, SHARED, cli
from bench.train_throughput import prepare  # the same shards as the training bench
from bloomline.config import load_config
from training.config import TrainRecipe


def overrides(data: Path) -> list[str]:
    vocab = json.loads((data / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    return [f"model.vocab_size={vocab}"]


def eval_vs_forward(data: Path, dtype: torch.dtype) -> tuple[float, float]:
    from bloomline.tokenizer import token_bytes
    from eval.tasks.validation import evaluate_model, language_samples
    from training.config import EvalConfig
    from training.data.shard_reader import ShardIndex, collate
    from training.loop.loss import token_losses
    from training.model.bloom import Bloom

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", overrides(data))
    model = Bloom(r.model, seed=1).to(dtype).eval()
    index = ShardIndex(data, "valid")
    cfg = EvalConfig()
    tb = token_bytes(data / "tokenizer" / "tokenizer.model")
    eos = int(index.manifest["tokenizer"]["eos_id"])
    # the same batches, collated in the loop as the trainer collates its own
    batches = [
        (refs[i : i + max(1, cfg.batch_tokens // bucket)], bucket)
        for lang in index.languages
        for bucket, refs in language_samples(index, lang, None)
        for i in range(0, len(refs), max(1, cfg.batch_tokens // bucket))
    ]
    tokens = sum(int((collate(index, r, b, index.pad_id)["labels"] != -100).sum()) for r, b in batches)
    evaluate_model(model, index, cfg, tb, eos)  # warm-up
    best_eval = best_fwd = 0.0
    for _ in range(2):  # the better of two runs each, alternated
        t0 = time.perf_counter()
        got = evaluate_model(model, index, cfg, tb, eos)
        best_eval = max(best_eval, sum(t.tokens for t in got.values()) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        with torch.no_grad():
            for refs, bucket in batches:
                b = collate(index, refs, bucket, index.pad_id)
                token_losses(model(b["input_ids"], b["segment_ids"]), b["labels"])
        best_fwd = max(best_fwd, tokens / (time.perf_counter() - t0))
    return best_eval, best_fwd


def train(data: Path, out: Path, steps: int, extra: list[str]) -> list[dict]:
    shutil.rmtree(out, ignore_errors=True)
    cli(
        "train",
        "--data",
        data,
        "--out",
        out,
        "-o",
        f"train.steps={steps}",
        "-o",
        "checkpoint.interval=10",
        "-o",
        "checkpoint.keep=1",
        "-o",
        "batch.tokens_per_step=16384",
        "-o",
        "batch.micro_batch_tokens=4096",
        "-o",
        "train.activation_checkpointing=false",
        *[x for o in [*overrides(data), *extra] for x in ("-o", o)],
    )
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-eval-bench"))
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = prepare(args.workdir)
    print(f"threads: {torch.get_num_threads()}")

    print("1. evaluation against the trainer's forward pass (model + loss, no backward), same batches (target ≥ 0.9×)")
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ev, fwd = eval_vs_forward(data, dtype)
        print(f"   {name}: evaluation {ev:,.0f} tokens/s, trainer's forward {fwd:,.0f} tokens/s, ratio {ev / fwd:.2f}")

    print("3. training with and without the automatic evaluation (bloomline train, 2 cores)")
    runs = {}
    for label, extra in (
        ("no evaluation", ["evaluation.enabled=false"]),
        ("evaluation, idle class, 1 thread (default)", []),
        ("evaluation at nice 10, 1 thread", ["evaluation.idle_priority=false"]),
        (
            "evaluation at nice 0, 2 threads",
            ["evaluation.idle_priority=false", "evaluation.nice=0", "evaluation.settings.threads=2"],
        ),
    ):
        m = train(data, args.workdir / f"run-{len(runs)}", args.steps, extra)
        after = [x for x in m if x["step"] > 10]  # from the first checkpoint on, when evaluations run
        tps = sum(x["global_batch_tokens"] for x in after) / sum(x["step_seconds"] for x in after)
        runs[label] = tps
        base = runs["no evaluation"]
        from eval.results.table import read_results

        done = sorted(
            {
                r["step"]: r["evaluated_at"].timestamp() - m[-1]["time"]
                for r in read_results(args.workdir / f"run-{len(runs) - 1}").to_pylist()
            }.items()
        )
        print(
            f"   {label:44s}: {tps:,.0f} tokens/s ({tps / base:.2f}× of no evaluation), slowest step "
            f"{max(x['step_seconds'] for x in after):.2f} s, median {np.median([x['step_seconds'] for x in after]):.2f} s"
            + (
                f"; evaluations done at {', '.join(f'step {s}: {d:+.0f} s' for s, d in done)} from the end of training"
                if done
                else ""
            )
        )

    print("2. one full per-language evaluation of the last checkpoint (all validation data, generations)")
    from eval.publish import evaluate
    from training.config import EvalConfig

    run = args.workdir / "run-0"
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    t0 = time.perf_counter()
    ev = evaluate(ckpt, data, EvalConfig(), "bench")
    langs = len({r["lang"] for r in ev.rows if r["scope"] == "language"})
    print(
        f"   {langs} languages, {ev.tokens:,} tokens, {len(ev.generations)} generations: {time.perf_counter() - t0:.1f} s "
        f"wall ({torch.get_num_threads()} threads)"
    )


if __name__ == "__main__":
    main()
