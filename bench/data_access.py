"""Benchmark of the trainer's data access as the data and the rank count grow (run by hand).

    python -m bench.data_access [--workdir /tmp/bloomline-data-bench] [--copies 8] [--before COMMIT]

Data: the shards `bloomline prepare` makes of ../shared/corpus, copied ``--copies`` times under
new names into a "×1" folder and 4·copies times into a "×4" folder (real copies: every shard its
own file and page-cache pages, as distinct data would be), each with its manifest.

1. One rank, in a fresh process each: start-up (open the shards, verify their checksums, build
   the sampler) and 20 steps of batches drawn and collated, on ×1 and on ×4. Reported: peak RSS
   (``ru_maxrss``), the RSS the data layer added over the process after its imports, and the
   start-up time. Next to it the same measurement with the code of ``--before`` (the commit before
   this change: every shard hashed by every rank, rows copied onto the heap by
   ``combine_chunks`` and cached, a stored permutation per stream), run from a git worktree.
   Target: a rank's RSS grows ≤ 1.1× for 4× the data.
2. Start-up of 8 ranks against 1 (torch.distributed, gloo, one process per rank, on ×4): the
   time until every rank has verified the data (once per run, split over the ranks) and drawn
   its first batch; next to it the same with every rank hashing every shard itself (as before).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.repo import REPO, SHARED, cli, repo_env

RANK = r"""
import json, os, resource, sys, time
import numpy as np, psutil, torch  # noqa: F401  (imports first: their RSS is not the data layer's)
from bloomline.config import load_config
from training.config import TrainRecipe
layout = [os.path.exists(os.path.join(os.environ["CODE"], *p)) for p in (("training", "data", "shard_reader.py"), ("training", "data.py"))]
new = any(layout)
if layout[0]:  # training/ in sub-packages
    from training.data.shard_reader import ShardIndex, collate, verify_once, torch_collectives
    from training.data.sampler import DynamicBatchSampler
elif new:  # one flat training/, data.py beside sampler.py
    from training.data import ShardIndex, collate, verify_once, torch_collectives
    from training.sampler import DynamicBatchSampler
else:
    from training.sampler import ShardIndex, collate, DynamicBatchSampler
data, stamp, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
world = int(os.environ.get("WORLD_SIZE", "1")); rank = int(os.environ.get("RANK", "0"))
if world > 1:
    torch.distributed.init_process_group("gloo")
r = load_config(TrainRecipe, os.path.join(os.environ["CODE"], "configs/train/bloom-tiny.yaml"),
                ["batch.tokens_per_step=16384", "batch.micro_batch_tokens=4096", "model.seq_len=2048"])
rss0 = psutil.Process().memory_info().rss
t0 = time.perf_counter()
if new:
    index = ShardIndex(data)
    if os.environ.get("HASH_ALL"):  # every rank hashes every shard itself (the old behaviour)
        hashed = verify_once(index, stamp + f".rank{rank}")
    else:
        hashed = verify_once(index, stamp, rank, world, *(torch_collectives() if world > 1 else ()))
else:
    index = ShardIndex(data, "train"); hashed = len(index.shards)
sampler = DynamicBatchSampler(index, r.batch, world, r.model.seq_len, 1234)
pad = index.pad_id
first = None
for step in range(steps):
    plan = sampler.next_step()
    for mb in plan.ranks[rank]:
        collate(index, mb, plan.bucket, pad)
    if first is None:
        first = time.perf_counter() - t0
if world > 1:
    torch.distributed.barrier()
print(json.dumps({"rank": rank, "startup_s": first, "hashed": hashed, "rss0_mb": rss0 / 2**20,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_mb": psutil.Process().memory_info().rss / 2**20}))
"""


def prepare(wd: Path) -> Path:
    out = wd / "prepared"
    if not (out / "manifest.json").exists():
        cli(
            "prepare",
            "--out",
            out,
            SHARED,
            "-o",
            "tokenizer.vocab_size=8000",
            "-o",
            "pack.buckets=[256,512,1024,2048]",
            "-o",
            "pack.valid_fraction=0.02",
        )
    return out


def replicate(src: Path, dst: Path, copies: int) -> Path:
    """``src``'s shards copied ``copies`` times (new names, same content) with a manifest listing all."""
    if (dst / "manifest.json").exists():
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    m = json.loads((src / "manifest.json").read_text())
    shutil.copytree(src / "tokenizer", dst / "tokenizer")
    shards = []
    for c in range(copies):
        for s in m["shards"]:
            path = s["path"].replace(".arrow", f"-copy{c:03d}.arrow")
            (dst / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / s["path"], dst / path)
            shards.append({**s, "path": path})
    m["shards"] = sorted(shards, key=lambda s: s["path"])
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def one_rank(code: Path, data: Path, steps: int = 20, stamp: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-c", RANK, str(data), str(stamp or f"{tmp}/stamp.json"), str(steps)],
            env=repo_env(code, CODE=str(code), DS_ACCELERATOR="cpu"),
            cwd=code,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return json.loads(out.strip().splitlines()[-1])


def ranks(code: Path, data: Path, world: int, hash_all: bool) -> list[dict]:
    from training.loop.launch import free_port

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        procs = []
        for rank in range(world):
            env = repo_env(
                code,
                CODE=str(code),
                RANK=str(rank),
                WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                **({"HASH_ALL": "1"} if hash_all else {}),
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", RANK, str(data), f"{tmp}/stamp.json", "1"],
                    env=env,
                    cwd=code,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            )
        outs = [p.communicate()[0] for p in procs]
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> None:
    from bloomline.host import available_cpus

    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-data-bench"))
    ap.add_argument("--copies", type=int, default=8, help="copies of the prepared corpus in the ×1 folder")
    ap.add_argument("--before", default="7d7a5e4", help="commit to compare with (the code before issue 7)")
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    wd = args.workdir
    wd.mkdir(parents=True, exist_ok=True)
    base = prepare(wd)
    x1, x4 = replicate(base, wd / "x1", args.copies), replicate(base, wd / "x4", 4 * args.copies)
    size = lambda d: sum(p.stat().st_size for p in (d / "shards").rglob("*.arrow")) / 2**20  # noqa: E731
    print(f"data ×1: {size(x1):,.0f} MiB of shards, ×4: {size(x4):,.0f} MiB")
    old = wd / "before"
    if not old.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(old), args.before],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    print("\n1. one rank: start-up (open, verify, sampler) + 20 steps of batches, fresh process each")
    res = {}
    for label, code in (("now", REPO), (f"before ({args.before})", old)):
        a, b = one_rank(code, x1), one_rank(code, x4)
        res[label] = (a, b)
        for name, r in (("×1", a), ("×4", b)):
            print(
                f"   {label:18s} {name}: peak RSS {r['peak_rss_mb']:7.0f} MiB (data layer +{r['peak_rss_mb'] - r['rss0_mb']:6.0f}"
                f" MiB over the imports), start-up to first batch {r['startup_s']:6.2f} s, shards hashed {r['hashed']}"
            )
        print(
            f"   {label:18s} peak RSS ×4 / ×1 = {b['peak_rss_mb'] / a['peak_rss_mb']:.3f}"
            f"   (data layer's share: {(b['peak_rss_mb'] - b['rss0_mb']) / max(1e-9, a['peak_rss_mb'] - a['rss0_mb']):.2f}×)"
        )

    with tempfile.TemporaryDirectory() as tmp:
        one_rank(REPO, x4, stamp=Path(tmp) / "stamp.json")
        again = one_rank(REPO, x4, stamp=Path(tmp) / "stamp.json")
    print(
        f"   now, a restart of the same run on ×4: start-up {again['startup_s']:.2f} s, shards hashed {again['hashed']}"
    )

    print("\n2. start-up of N ranks on ×4 (until every rank has verified the data and drawn its first batch)")
    for world in (1, 8):
        for hash_all in (False, True):
            t0 = time.perf_counter()
            rs = ranks(REPO, x4, world, hash_all)
            wall = time.perf_counter() - t0
            how = "every rank hashes every shard" if hash_all else "checksums once per run, split over ranks"
            print(
                f"   {world} rank(s), {how:42s}: slowest rank {max(r['startup_s'] for r in rs):6.2f} s "
                f"(wall with process start {wall:5.1f} s), shards hashed per rank {max(r['hashed'] for r in rs)}"
            )
            if world == 1:
                break  # one rank: the two ways are the same
    print(f"\n(machine: {available_cpus()} cores; 8 ranks share them)")


if __name__ == "__main__":
    main()
