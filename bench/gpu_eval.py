"""The evaluation on the accelerator: one prepared script for the `device` machine (prints figures).

Here (CPU), a dry run on bloom-tiny so no device time is spent finding a typo:

    python -m bench.gpu_eval --smoke --data DATA_DIR        # device=cpu, fp32

On the device, from bench/gpu/run.sh (after bench/gpu_validate.py), on .gpu/data:

    python3 -m bench.gpu_eval --data .gpu/data --out $OUT

A checkpoint of bloom-560m's shape (24 layers × 1024, 16 heads; the carried data's vocabulary) is
written from its initial weights (timings do not depend on what the weights learned), then, with
``device=cuda`` and bf16 (the evaluation's default on a GPU):

1. ``eval.publish.evaluate``: the validation task and ``continuation``; validation tokens/s and
   each task's seconds;
2. greedy generation, 16 prompts × 24 new tokens: tokens/s with the key-value cache
   (``eval.generate.generate``) against without (``greedy``, the whole sequence each token);
3. one lm-eval family (xstorycloze items built from the validation text) through our evaluator
   against ``lm_eval --model hf`` on the checkpoint's export, on the same device — when lm-eval and
   transformers are installed there (the device machine has neither unless they are carried);
   otherwise it says so.

Writes ``OUT/gpu_eval.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from bench.repo import REPO
from bloomline.config import from_dict, load_config
from tests.support.checkpoints import one_rank_checkpoint
from training.config import EvalConfig, TrainRecipe
from training.model.bloom import Bloom

NEW_TOKENS = 24
PROMPTS = 16


def write_checkpoint(data: Path, folder: Path, smoke: bool) -> Path:
    """A one-rank checkpoint (ZeRO 0's files) of the model's initial weights."""
    over = ["parallel.zero_stage=0"]
    if not smoke:  # bloom-560m's shape, fewer layers off: the real width and depth
        over += ["model.hidden_size=1024", "model.num_heads=16", "model.num_layers=24", "model.seq_len=2048"]
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", over)
    manifest = json.loads((data / "manifest.json").read_text())
    r.model.vocab_size = int(manifest["tokenizer"]["vocab_size"])
    r.model.seq_len = min(r.model.seq_len, max(int(b) for b in manifest["buckets"]))
    return one_rank_checkpoint(folder / "run" / "checkpoints" / "step_1", Bloom(r.model, seed=1).state_dict(), r, data)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def generation(step: Path, data: Path, device: torch.device, dtype: torch.dtype) -> dict:
    """Greedy tokens/s with and without the key-value cache, on the validation text's prompts."""
    from eval.generate import generate, greedy
    from eval.model import LocalModel
    from training.checkpoint.load import load_model
    from training.data.shard_reader import ShardIndex

    bloom, _ = load_model(step, dtype)
    model = LocalModel(bloom, device)
    index = ShardIndex(data, "valid")
    prompts = []
    for sid in range(len(index.manifest["shards"])):
        if len(prompts) == PROMPTS:
            break
        try:
            toks, _ = index.fetch(sid, 0)
        except Exception:  # a training shard: not in the validation index
            continue
        prompts.append(toks[:32].tolist())
    prompts = (prompts * PROMPTS)[:PROMPTS]
    eos = int(index.manifest["tokenizer"]["eos_id"])
    generate(model, prompts[:2], 2, -1)  # warm-up (kernels, allocator)
    sync(device)
    t = time.perf_counter()
    cached = generate(model, prompts, NEW_TOKENS, -1)  # eos -1: every prompt runs all 24 tokens
    sync(device)
    with_cache = time.perf_counter() - t
    t = time.perf_counter()
    plain = [greedy(model.bloom, p, NEW_TOKENS, -1) for p in prompts]
    sync(device)
    without = time.perf_counter() - t
    n = PROMPTS * NEW_TOKENS
    return {
        "tokens": n,
        "with_cache_tokens_s": n / with_cache,
        "without_cache_tokens_s": n / without,
        "speedup": without / with_cache,
        "same_tokens": cached == plain,
        "eos_id": eos,
    }


def lm_eval_family(step: Path, data: Path, device: torch.device, work: Path, precision: str) -> dict:
    """One family through our evaluator against ``lm_eval --model hf`` on the export, same device."""
    try:
        import lm_eval  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return {"measured": False, "why": f"not installed on this machine: {e.name}"}
    from bloomline.task_spec import TaskSpec
    from eval.harness import validation_documents
    from eval.publish import evaluate
    from eval.tasks import make
    from eval.tasks.lm_eval_local import export_lm_args, run_lm_eval
    from training.hf.to_hf import export

    langs = ["en", "sw"]
    (work / "xstorycloze").mkdir(parents=True)
    for lang in langs:  # stories of five-word pieces of the language's validation text
        words = " ".join(validation_documents(data, lang)).split()
        words = words * (300 // max(len(words), 1) + 1)  # enough for 60 pieces, however short the split
        p = [" ".join(words[i * 5 : i * 5 + 5]) for i in range(60)]
        recs = [
            {
                **{f"input_sentence_{i + 1}": p[k * 6 + i] for i in range(4)},
                "sentence_quiz1": p[k * 6 + 4],
                "sentence_quiz2": p[k * 6 + 5],
                "answer_right_ending": 1 + k % 2,
            }
            for k in range(8)
        ]
        (work / "xstorycloze" / f"{lang}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    spec = TaskSpec(name="xstorycloze", data=str(work / "xstorycloze"), langs=langs)
    cfg = from_dict(EvalConfig, {"device": device.type, "precision": precision, "max_tokens_per_lang": 64})
    cfg.tasks = [spec]
    cfg.prompts_per_lang = 0
    ev = evaluate(step, data, cfg, "bench")
    ours = ev.task_seconds["xstorycloze"]
    hf = export(step, work / "hf", data, precision)
    names = list(make(spec).write({l: work / "xstorycloze" / f"{l}.jsonl" for l in langs}, work / "yaml").values())
    eos = json.loads((hf / "config.json").read_text())["eos_token_id"]
    seq = json.loads((step / "bloomline.json").read_text())["model"]["seq_len"]
    args = export_lm_args(hf, seq, eos).replace(
        "dtype=float32", f"dtype={'bfloat16' if precision == 'bf16' else 'float32'}"
    )
    t = time.perf_counter()
    run_lm_eval("hf", names, work / "yaml", None, model_args=args, device=str(device))
    theirs = time.perf_counter() - t
    return {"measured": True, "ours_s": ours, "lm_eval_hf_s": theirs, "ratio": ours / theirs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=REPO / ".gpu" / "data")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/bloomline-gpu")))
    ap.add_argument("--smoke", action="store_true", help="CPU dry run on bloom-tiny")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    precision = "fp32" if args.smoke else "bf16"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "precision": precision}
    with tempfile.TemporaryDirectory(prefix="bloomline-gpu-eval-") as tmp:
        work = Path(tmp)
        step = write_checkpoint(args.data, work, args.smoke)
        from eval.publish import evaluate

        cfg = from_dict(
            EvalConfig,
            {
                "device": device.type,
                "max_tokens_per_lang": 4096,
                "prompts_per_lang": 0,
                "tasks": [{"name": "continuation"}],
            },
        )
        t = time.perf_counter()
        ev = evaluate(step, args.data, cfg, "bench")
        out["evaluate"] = {
            "seconds": time.perf_counter() - t,
            "validation_tokens": ev.tokens,
            "validation_tokens_s": ev.tokens / ev.task_seconds["validation"],
            "task_seconds": ev.task_seconds,
            "eval_layout": ev.rows[0]["eval_layout"],
            "precision": ev.rows[0]["precision"],
        }
        print("evaluate:", json.dumps(out["evaluate"]), flush=True)
        out["generation"] = generation(step, args.data, device, dtype)
        print("generation:", json.dumps(out["generation"]), flush=True)
        out["lm_eval"] = lm_eval_family(step, args.data, device, work, precision)
        print("lm-eval family:", json.dumps(out["lm_eval"]), flush=True)
    (args.out / "gpu_eval.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
