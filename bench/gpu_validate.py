"""GPU validation of the trainer: one prepared script for the `device` machine (prints figures).

Here (CPU), once, to build the bundle the device needs (wheels it lacks + shards), then a dry run
of this same script on bloom-tiny so no device time is spent finding a typo:

    bash bench/gpu/bundle.sh                       # -> .gpu/whl, .gpu/data (git-ignored)
    python -m bench.gpu_validate --smoke           # CPU, gloo, bloom-tiny, a few steps

On the device (one `run`, carry [".gpu"], timeout_s 540):

    bash bench/gpu/run.sh                          # installs .gpu/whl, runs this with --out $OUT,
                                                   # then bench/gpu_eval.py (the evaluation on the GPU)

Runs, each through the DeepSpeed launcher with the NCCL backend, on bloom-560m-sized layers
(24 layers × 1024, 16 heads, seq 2048; the vocabulary of the carried shards):

1. bf16 with activation checkpointing (BLOOM's setting), 2. bf16 without it — tokens/s and MFU
   (model FLOPs 6N + 12·L·H·T per token, recomputation not counted) against the measured bf16
   matmul peak (8192³) and H200's nominal dense bf16 peak;
3. fp16 with DeepSpeed's dynamic loss scaling — the loss-scale trajectory, overflows, loss;
4. bf16 with ZeRO-Offload (``parallel.offload_optimizer=cpu``, a few steps; DeepSpeed's CPU Adam,
   built first and its build time printed) — what ``bloomline plan --offload`` plans;
on GPU also bf16 with ``model.attention=flex``, and with ``auto`` + ``train.compile`` (the
trainer's timing of both kernels is in its log). Every run prints its peak GPU memory (nvidia-smi,
the ranks' CUDA context and allocator cache included) beside the planner's figure for its recipe
(training/planning/planner.py: the fullest stage's ``memory_gib``, ``offload_memory_gib`` offloaded).

Writes ``OUT/gpu_summary.json`` and each run's ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from bench.repo import REPO
from bloomline.config import load_config, to_dict
from training.config import TrainRecipe
from training.loop.launch import launch_command, run_job

H200_BF16_DENSE = 989e12  # NVIDIA's H200 SXM datasheet, dense (no sparsity)
# what each run prints on its memory line: measured beside planned
MEMORY_KEYS = ("peak_gpu_gib", "planned_gib", "planned_offload_gib", "planned_on", "cpu_adam_build_s", "cpu_adam_error")


def matmul_peak(n: int, device: str) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    reps = 20 if device == "cuda" else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def gpu_used_gib() -> float:
    """GPU 0's used memory, all processes (nvidia-smi)."""
    out = subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    ).stdout
    return float(out.split()[0]) / 1024


def planned_gib(recipe: TrainRecipe) -> dict[str, float]:
    """The planner's memory for ``recipe`` on this GPU (its fullest stage), offloaded or not."""
    from training.planning.planner import DEVICES, cpu_device, plan

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    device = next((d for k, d in DEVICES.items() if k.split("-")[0].upper() in name), None) or cpu_device()
    offload = recipe.parallel.offload_optimizer != "none"
    worst = max(plan(recipe, device, offload=offload)["stages"], key=lambda st: st["memory_gib"])
    out = {"planned_gib": worst["memory_gib"], "planned_on": device.name}
    if offload:
        out["planned_offload_gib"] = worst["offload_memory_gib"]
    return out


def build_cpu_adam() -> dict[str, object]:
    """Build (or load from ~/.cache/torch_extensions) DeepSpeed's CPU Adam before the offload run,
    so its compile time is measured apart from training and a missing compiler is said once."""
    t0 = time.perf_counter()
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder

        CPUAdamBuilder().load()
    except Exception as e:  # no compiler, ninja or Python headers on this machine
        return {"cpu_adam_error": f"{type(e).__name__}: {e}"[:500]}
    return {"cpu_adam_build_s": round(time.perf_counter() - t0, 1)}


def launch(recipe: TrainRecipe, data: Path, run: Path, timeout: float) -> tuple[int, float, float | None]:
    """One training job through the DeepSpeed launcher, in its own process group (killed whole
    on timeout: the ranks must not keep the GPU after the launcher is gone); its status, wall time
    and peak GPU memory in GiB (nvidia-smi every 0.2 s, less what was in use before it; None on CPU)."""
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps(to_dict(recipe)))
    cmd = launch_command(run / "recipe.json", data, run, recipe.parallel.world_size)
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["DS_ACCELERATOR"] = "cpu"
        env["BLOOMLINE_CPU_FP16"] = "1"  # the smoke run's fp16 on torch's reference kernels (training/config/drills.py)
    cuda = torch.cuda.is_available()
    before = gpu_used_gib() if cuda else 0.0
    seen = [before]
    t0 = time.perf_counter()
    poll = (lambda: seen.append(gpu_used_gib())) if cuda else None
    rc = run_job(cmd, run / "log.txt", env, timeout=timeout, cwd=REPO, poll=poll, poll_s=0.2)
    return rc, time.perf_counter() - t0, round(max(seen) - before, 3) if cuda else None


def summarise(
    name: str, run: Path, flops_at: Callable[[int], float], peaks: dict[str, float], rc: int, wall: float
) -> dict:
    lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
    m = [json.loads(l) for l in lines]
    timed = m[3:] if len(m) > 5 else m[1:]  # the first steps include warm-up (allocator, kernels)
    secs = sum(x["step_seconds"] for x in timed)
    tps = sum(x["global_batch_tokens"] for x in timed) / secs if timed and secs > 0 else 0.0
    # FLOPs step by step: the attention term depends on the step's bucket (sequence length)
    flops = sum(flops_at(int(x["bucket"])) * x["global_batch_tokens"] for x in timed)
    out = {
        "run": name,
        "rc": rc,
        "wall_s": round(wall, 1),
        "steps": len(m),
        "tokens_per_s": round(tps),
        "buckets": sorted({x["bucket"] for x in m}),
        "mfu": {k: round(flops / secs / v, 4) if secs > 0 else 0.0 for k, v in peaks.items()},
        "loss_first_last": [m[0]["loss"], m[-1]["loss"]] if m else None,
        "grad_norm_last": m[-1]["grad_norm"] if m else None,
        "skipped": sum(1 for x in m if x.get("skipped")),
        "loss_scale": [x.get("loss_scale") for x in m] if m and m[0].get("loss_scale") is not None else None,
    }
    if rc != 0:
        out["log_tail"] = (run / "log.txt").read_text(errors="replace").splitlines()[-25:]
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=REPO / ".gpu" / "data")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/bloomline-gpu")))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--smoke", action="store_true", help="CPU dry run on bloom-tiny")
    ap.add_argument("--budget-s", type=float, default=480, help="stop starting runs after this many seconds")
    args = ap.parse_args()
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available()
    print(
        f"torch {torch.__version__}, cuda {torch.version.cuda}, device "
        f"{torch.cuda.get_device_name(0) if cuda else 'cpu'}",
        flush=True,
    )
    if args.smoke:
        data = args.data
        if not (data / "manifest.json").exists():
            from data_prep.config import PrepareConfig
            from data_prep.pipeline import run_all

            data = args.out / "smoke-data"
            if not (data / "manifest.json").exists():
                run_all(load_config(PrepareConfig, REPO / "configs/data/demo.yaml"), data)
        base, steps = "bloom-tiny", 4
        shape = ["batch.tokens_per_step=8192", "batch.micro_batch_tokens=4096"]
    else:
        data, base, steps = args.data, "bloom-560m", args.steps
        # 64 sequences of 2048 per step, micro-batches of 8 × 2048: ~25 steps fit a few minutes.
        shape = ["batch.tokens_per_step=131072", "batch.micro_batch_tokens=16384"]
    manifest = json.loads((data / "manifest.json").read_text())
    vocab = manifest["tokenizer"]["vocab_size"]
    # the data's own tokenizer: its table padded by Megatron's rule, not bloom-560m's fixed 250,880 rows
    common = [
        f"model.vocab_size={vocab}",
        "model.pad_vocab_to=null",
        f"model.seq_len={max(2048, max(manifest['buckets']))}",
        f"train.steps={steps}",
        f"checkpoint.interval={steps}",
        "optim.warmup_steps=5",
        "parallel.backend=auto",
        *shape,
    ]

    peaks = {"measured_bf16_matmul": matmul_peak(8192 if cuda else 1024, "cuda" if cuda else "cpu")}
    if cuda:
        peaks["h200_nominal_bf16_dense"] = H200_BF16_DENSE
    print(f"bf16 matmul peak: {peaks['measured_bf16_matmul'] / 1e12:.1f} TFLOP/s", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    # run folders (checkpoints included) outside OUT: only small files go back from the device
    work = Path(tempfile.mkdtemp(prefix="bloomline-gpu-"))
    runs = [
        ("bf16_ckpt", ["train.precision=bf16", "train.activation_checkpointing=true", "model.attention=sdpa"]),
        # bf16_ckpt with the optimizer offloaded: a few steps (CPU Adam steps the whole model on the host)
        (
            "bf16_ckpt_offload",
            [
                "train.precision=bf16",
                "train.activation_checkpointing=true",
                "model.attention=sdpa",
                "parallel.offload_optimizer=cpu",
                f"train.steps={min(steps, 8)}",
                f"checkpoint.interval={min(steps, 8)}",
            ],
        ),
        # FlexAttention (block-sparse over documents) has no CPU backward: GPU only; then the
        # default (auto: the trainer times both kernels and prints its choice) with every block
        # compiled (train.compile)
        *(
            [
                (
                    "bf16_ckpt_flex",
                    ["train.precision=bf16", "train.activation_checkpointing=true", "model.attention=flex"],
                ),
                (
                    "bf16_ckpt_auto_compile",
                    [
                        "train.precision=bf16",
                        "train.activation_checkpointing=true",
                        "model.attention=auto",
                        "train.compile=true",
                    ],
                ),
            ]
            if cuda
            else []
        ),
        ("bf16_nockpt", ["train.precision=bf16", "train.activation_checkpointing=false"]),
        (
            "fp16_dynamic_scale",
            [
                "train.precision=fp16",
                "train.activation_checkpointing=false",
            ],
        ),
    ]
    results = []
    for name, extra in runs:
        left = args.budget_s - (time.perf_counter() - t_start)
        if left < 60:
            print(f"skipping {name}: {left:.0f} s of the budget left", flush=True)
            continue
        r = load_config(TrainRecipe, REPO / f"configs/train/{base}.yaml", [*common, *extra])
        from training.model.bloom import Bloom

        with torch.device("meta"):
            model = Bloom(r.model)
        built = build_cpu_adam() if r.parallel.offload_optimizer != "none" else {}
        if "cpu_adam_error" in built:  # the offload run cannot start here: said once, counted as failed
            results.append({"run": name, "rc": 1, **built})
            print(json.dumps(results[-1]), flush=True)
            continue
        rc, wall, peak = launch(r, data, work / name, timeout=left - 10)
        results.append(summarise(name, work / name, model.flops_per_token, peaks, rc, wall))
        results[-1].update(model_flops_per_token_at_seq_len=model.flops_per_token(r.model.seq_len), **built)
        results[-1].update(peak_gpu_gib=peak, **planned_gib(r))
        print(f"{name}: {json.dumps({k: v for k, v in results[-1].items() if k in MEMORY_KEYS})}", flush=True)
        if (work / name / "metrics.jsonl").exists():
            shutil.copy(work / name / "metrics.jsonl", args.out / f"{name}.metrics.jsonl")
        shutil.rmtree(work / name, ignore_errors=True)  # checkpoints: GBs at 560m
    summary = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "peaks_flops": peaks,
        "model": base,
        "vocab": vocab,
        "runs": results,
    }
    (args.out / "gpu_summary.json").write_text(json.dumps(summary, indent=1))
    sys.exit(0 if results and all(x["rc"] == 0 for x in results) else 1)


if __name__ == "__main__":
    main()
