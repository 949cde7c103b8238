"""Benchmark of ``train.compile`` (torch.compile of each block) on this machine (run by hand).

    python -m bench.compile [--steps 40] [--workdir /tmp/bloomline-train-bench]

The trainer (DeepSpeed, real launcher, bf16, bloom-tiny, the shards of bench/train_throughput.py)
run twice on the same steps, without and with ``train.compile``: tokens/s over the steps after
every bucket has been seen once (the steady state; each new bucket shape compiles, and after two
shapes torch marks the sequence dimension dynamic), the seconds the first step of each bucket
took beyond that bucket's steady step time (compile cost), and the ratio. One run, same batches.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.train_throughput import setup, trainer_tokens_per_s


def split(run: Path) -> tuple[float, float]:
    """(steady tokens/s after every bucket was seen, compile seconds of first occurrences)."""
    m = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    seen, first, steady = set(), [], []
    for x in m:
        (first if x["bucket"] not in seen else steady).append(x)
        seen.add(x["bucket"])
    last_new = max(i for i, x in enumerate(m) if x in first)
    tail = m[last_new + 1 :]
    tps = sum(x["global_batch_tokens"] for x in tail) / sum(x["step_seconds"] for x in tail)
    per_bucket = {}
    for x in steady:
        per_bucket.setdefault(x["bucket"], []).append(x["step_seconds"])
    extra = sum(x["step_seconds"] - min(per_bucket.get(x["bucket"], [x["step_seconds"]])) for x in first)
    return tps, extra


def main() -> None:
    args, data = setup(40)
    res = {}
    for name, extra in (("eager", []), ("compiled", ["train.compile=true"])):
        trainer_tokens_per_s(data, args.workdir, args.steps, extra, run_name=f"run-{name}")
        res[name] = split(args.workdir / f"run-{name}")
        print(
            f"{name:8s}: steady {res[name][0]:,.0f} tokens/s; first step of each bucket: {res[name][1]:.1f} s "
            f"beyond the steady step time"
        )
    print(f"compiled / eager, steady state: {res['compiled'][0] / res['eager'][0]:.2f}")


if __name__ == "__main__":
    main()
