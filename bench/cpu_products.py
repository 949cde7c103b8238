"""Benchmark of reduced-precision training steps on this CPU (run by hand; prints figures).

    python -m bench.cpu_products [--repeats 3]

bloom-tiny's forward and backward on 4 x 512 tokens, in one process, timed per dtype: fp32; bf16
and fp16 with PyTorch's own CPU kernels; and bf16 and fp16 with their products in fp32
(training/model/reduced_on_cpu.py, what the trainer uses on a CPU without bf16/fp16 instructions).
Beside each, how far the gradients are from the fp32 step's (the norm of the difference over
the norm, all parameters together): the price of the dtype, which the fp32 products must not raise.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.repo import REPO
from bloomline.config import load_config
from training.config import TrainRecipe
from training.model.bloom import Bloom
from training.model.reduced_on_cpu import Fp32Products, native_kernels


def step(model: Bloom, ids: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(ids).float().logsumexp(-1).mean().backward()


def timed(model: Bloom, ids: torch.Tensor, repeats: int, mode: Fp32Products | None) -> float:
    def once() -> None:
        if mode is None:
            step(model, ids)
        else:
            with mode:
                step(model, ids)

    once()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        once()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml").model
    torch.manual_seed(0)
    base = Bloom(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    fp32 = timed(base, ids, args.repeats, None)
    ref = [p.grad.clone() for p in base.parameters()]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(f"{'dtype':<6} {'kernels':<14} {'s/step':>8} {'vs fp32':>8} {'grad diff':>10}")
    print(f"{'fp32':<6} {'native':<14} {fp32:8.3f} {1.0:8.2f} {0.0:10.2e}")
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        model = Bloom(cfg).to(dtype)
        model.load_state_dict({k: v.to(dtype) for k, v in base.state_dict().items()})
        own = "native" if native_kernels(dtype) else "reference"
        for kernels, mode in ((f"torch {own}", None), ("fp32 products", Fp32Products(dtype))):
            s = timed(model, ids, args.repeats, mode)
            got = torch.cat([p.grad.float().flatten() for p in model.parameters()])
            want = torch.cat([r.flatten() for r in ref])
            diff = ((got - want).norm() / want.norm()).item()
            print(f"{name:<6} {kernels:<14} {s:8.3f} {s / fp32:8.2f} {diff:10.2e}")


if __name__ == "__main__":
    main()
