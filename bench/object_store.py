"""Object storage against local disk (run by hand; prints figures), on an S3 server on loopback
(moto in server mode, tests/support/s3.py: every request signed and checked, as AWS does).

    python -m bench.object_store [--mb 208] [--workdir /tmp/bloomline-object-store] [--steps 24]

1. ``bloomline prepare`` of a corpus grown from ../shared/corpus (16× its 13 MB by default:
   per-language Markov walks, tests/support/grow.py), the CLI with its Prefect server and a Dask
   LocalCluster of 2 workers, as bench/scale.py runs it: inputs and output on local disk, then
   inputs in a bucket and output to an S3 URL. Whole commands timed; throughput ratio S3 / local
   (target ≥ 0.8), and the shards compared by sha256 (must be equal).
2. Training bloom-tiny on that data, one rank: tokens/s with the data on local disk, then with
   ``--data s3://…`` (the node's shard cache cold, then warm). Target: warm ≥ 0.95× local.
   Beside it, the two ways to read a shard from the store: fetched whole (what the cache does)
   and read as an Arrow stream through fsspec's ranged reads, MB/s each.
3. The checkpoint mirror: the upload time of that run's last checkpoint (files, bloomline.json,
   latest), MB and MB/s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from bench.repo import REPO, SHARED, cli
from tests.support.grow import grow
from tests.support.s3 import S3Server

WORKERS = 2
OVERRIDES = ["tokenizer.sample_bytes=20000000", "read.chunk_bytes=4194304", f"dask.n_workers={WORKERS}"]


def timed_prepare(inputs: str, out: str) -> float:
    t = time.perf_counter()
    cli("prepare", inputs, "--out", out, *[x for o in OVERRIDES for x in ("-o", o)])
    return time.perf_counter() - t


def shard_digests(files: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}


def train_tokens_per_s(data: str, vocab: int, run: Path, steps: int) -> tuple[float, Path]:
    """One rank of bloom-tiny for ``steps`` steps on ``data``: tokens/s over the steps after the
    first two (start-up, and a cold cache's fetches, fall in those and in the start)."""
    import subprocess

    from bloomline.config import load_config, to_dict
    from training.config import TrainRecipe
    from training.loop.launch import launch_command
    from training.parallel.shm import release_job_shm

    r = load_config(
        TrainRecipe,
        REPO / "configs/train/bloom-tiny.yaml",
        [
            f"model.vocab_size={vocab}",
            f"train.steps={steps}",
            f"checkpoint.interval={steps}",
            "train.activation_checkpointing=false",
            "batch.tokens_per_step=16384",
            "batch.micro_batch_tokens=4096",
        ],
    )
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps(to_dict(r)))
    cmd = launch_command(run / "recipe.json", data, str(run), 1)
    t = time.perf_counter()
    try:
        subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, "DS_ACCELERATOR": "cpu"}, capture_output=True)
    finally:
        release_job_shm(cmd)
    wall = time.perf_counter() - t
    m = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    steady = m[2:]
    print(f"    {data}: {wall:.1f} s for the whole run", flush=True)
    return sum(x["global_batch_tokens"] for x in steady) / sum(x["step_seconds"] for x in steady), run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=208.0, help="corpus size (16× the 13 MB shared corpus)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-object-store"))
    ap.add_argument("--steps", type=int, default=24)
    a = ap.parse_args()
    wd = a.workdir
    wd.mkdir(parents=True, exist_ok=True)
    corpus = wd / f"corpus-{a.mb:g}mb"
    if not corpus.is_dir():
        print(f"growing a {a.mb:g} MB corpus from {SHARED} ...", flush=True)
        grow(corpus, a.mb)
    server = S3Server(wd / "moto.log", bucket="bench")
    os.environ.update(server.env)
    fs = server.fs()
    try:
        t = time.perf_counter()
        fs.put(str(corpus), "bench/corpus", recursive=True)
        mb = sum(p.stat().st_size for p in corpus.rglob("*") if p.is_file()) / 1e6
        print(f"corpus: {mb:.0f} MB uploaded in {time.perf_counter() - t:.1f} s", flush=True)

        print("\n1. prepare (the CLI, 2 Dask workers)", flush=True)
        local_out = wd / "prepared"
        shutil.rmtree(local_out, ignore_errors=True)
        t_local = timed_prepare(str(corpus), str(local_out))
        t_s3 = timed_prepare("s3://bench/corpus", "s3://bench/prepared")
        local = shard_digests(
            {p.relative_to(local_out).as_posix(): p.read_bytes() for p in (local_out / "shards").rglob("*.arrow")}
        )
        fs.invalidate_cache()
        remote = shard_digests({f[len("bench/prepared/") :]: fs.cat_file(f) for f in fs.find("bench/prepared/shards")})
        print(f"  local disk → local disk: {t_local:.1f} s ({mb / t_local:.2f} MB/s)")
        print(f"  S3 → S3:                 {t_s3:.1f} s ({mb / t_s3:.2f} MB/s)")
        print(f"  throughput S3 / local:   {t_local / t_s3:.2f}× (target ≥ 0.8)")
        print(f"  shards: {len(local)} local, {len(remote)} on S3, byte-identical: {local == remote}", flush=True)

        print("\n2. training tokens/s, bloom-tiny, one rank", flush=True)
        vocab = json.loads((local_out / "manifest.json").read_text())["tokenizer"]["vocab_size"]
        os.environ["BLOOMLINE_DATA_CACHE"] = str(wd / "data-cache")
        shutil.rmtree(wd / "data-cache", ignore_errors=True)
        local_tps, _ = train_tokens_per_s(str(local_out), vocab, wd / "run-local", a.steps)
        cold_tps, _ = train_tokens_per_s("s3://bench/prepared", vocab, wd / "run-s3-cold", a.steps)
        warm_tps, run = train_tokens_per_s("s3://bench/prepared", vocab, wd / "run-s3-warm", a.steps)
        print(f"  local data:      {local_tps:,.0f} tokens/s")
        print(f"  S3, cold cache:  {cold_tps:,.0f} tokens/s ({cold_tps / local_tps:.3f}×)")
        print(f"  S3, warm cache:  {warm_tps:,.0f} tokens/s ({warm_tps / local_tps:.3f}×, target ≥ 0.95)")
        shards = sorted(fs.find("bench/prepared/shards"), key=lambda f: -fs.info(f)["size"])[:8]
        size = sum(fs.info(f)["size"] for f in shards) / 1e6
        t = time.perf_counter()
        for f in shards:
            fs.get_file(f, str(wd / "whole.arrow"))
        whole = size / (time.perf_counter() - t)
        import pyarrow as pa

        t = time.perf_counter()
        for f in shards:
            with fs.open(f, "rb") as fh:
                pa.ipc.open_stream(fh).read_all()
        ranged = size / (time.perf_counter() - t)
        print(
            f"  reading the 8 largest shards ({size:.1f} MB): whole fetch {whole:.0f} MB/s, ranged stream reads {ranged:.0f} MB/s"
        )

        print("\n3. the checkpoint mirror", flush=True)
        from training.checkpoint.mirror import upload_checkpoint
        from training.checkpoint.run_dir import RunDir

        rd = RunDir(run)
        secs, sent = upload_checkpoint(rd, rd.latest_step(), "s3://bench/mirror", keep=2)
        print(f"  step {rd.latest_step()}: {sent / 1e6:.1f} MB uploaded in {secs:.2f} s ({sent / 1e6 / secs:.0f} MB/s)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
