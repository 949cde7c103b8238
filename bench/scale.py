"""`bloomline prepare` at corpus scale: time and memory of every process as the corpus grows
(run by hand; prints figures).

    python -m bench.scale [--base-mb 256] [--sizes 1,4,16] [--workdir /tmp/bloomline-scale]
                          [--repo PATH] [--skip-speedup] [--skip-datatrove] [--skip-manifest]

1. Corpora of ``--base-mb`` × each size, grown from ../shared/corpus by per-language Markov walks
   with 4% duplicates put back (tests/support/grow.py): unique, realistic documents.
2. Per size, the whole ``bloomline prepare`` (the CLI with its temporary Prefect server, a Dask
   LocalCluster of 2 workers, the full pipeline as configs/data/demo.yaml has it, with
   ``tokenizer.sample_bytes`` 20 MB and ``read.chunk_bytes`` 4 MiB, see OVERRIDES): wall time, documents/s, MB/s, and the peak RSS of the
   driver (the CLI process) and of the largest Dask worker, each process sampled every 0.1 s
   (tests/support/proctree.py); the dedup pass's seconds from ``run_stats.json``.
3. Per size, the dedup pass alone, on that run's chunk files, with a LocalCluster of 1 worker and
   of 2 workers: seconds and the speed-up (target ≥ 1.6).
4. Flatness: each process's peak at the largest size over its peak at the smallest (target ≤ 1.25).
5. At 4×: bloomline against datatrove doing the same steps (quality filter, MinHash dedup,
   tokenization with the same tokenizer; langid and PII off, which datatrove's run lacks) with 2
   workers, whole runs timed from outside (tests/support/datatrove_baseline.py; target: ≥ 3× faster).
6. ``manifest.json`` with 100,000 shards: the seconds to write it and to load and check it, and
   its size.
7. ``--many-files-only``: the same 40 MB of documents as 1,000 and as 10,000 small files of mixed
   formats (JSONL, JSONL.gz, Parquet): plan seconds, wall time, the driver's peak RSS, Dask tasks
   and Prefect task runs (none per file).

``--repo PATH`` runs another checkout's CLI (sections 2 and 4 only: a before/after comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from bench.repo import REPO, cli_command, repo_env
from tests.support.grow import grow
from tests.support.proctree import run_sampled

WORKERS = 2
# read.chunk_bytes 4 MiB: the 1× corpus holds about 4 MB per language file, so with the default
# 32 MiB a chunk would grow with the corpus up to 32 MiB, and with it the chunks pass's memory
# (bounded by read.chunk_bytes, checked against memory_gib): full chunks at every size measure
# what grows with the corpus itself.
OVERRIDES = [
    "tokenizer.sample_bytes=20000000",
    "read.chunk_bytes=4194304",
    f"dask.n_workers={WORKERS}",
    "keep_work=true",
]


def prepare(repo: Path, inputs: Path, out: Path, overrides: list[str]):
    shutil.rmtree(out, ignore_errors=True)
    cmd = cli_command("prepare", "--out", out, inputs, *[x for o in overrides for x in ("-o", o)])
    res = run_sampled(cmd, repo, repo_env(repo))
    if res.returncode:
        raise SystemExit(f"prepare failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return res, json.loads((out / "run_stats.json").read_text()), json.loads((out / "manifest.json").read_text())


def run_config() -> dict:
    """The config the CLI runs above used (the recipe and OVERRIDES)."""
    from bloomline.config import load_config, to_dict
    from data_prep.config import PrepareConfig

    return to_dict(load_config(PrepareConfig, REPO / "configs/data/demo.yaml", OVERRIDES))


def dedup_alone(out: Path, workers: int, config: dict) -> float:
    """Seconds of the dedup pass alone over the chunk files of a finished run (kept with
    keep_work; the run's manifest goes), on a fresh LocalCluster of ``workers`` single-threaded
    processes."""
    from distributed import Client, LocalCluster

    from bloomline.config import from_dict
    from bloomline.io import read_json
    from data_prep.config import PrepareConfig
    from data_prep.dedup.driver import run_dedup
    from data_prep.storage.workdir import Paths, clean_dedup
    from flows.run.dask_cluster import dask_map

    cfg = from_dict(PrepareConfig, config)
    paths = Paths(out)
    chunk_ids = [c["id"] for c in read_json(paths.work / "plan.json")["chunks"]]
    docs = {c: read_json(paths.chunk_done(c))["docs"] for c in chunk_ids}
    clean_dedup(paths)
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        # warm, as a run's workers are when its dedup pass starts: the modules imported, the band shape known
        client.run(
            lambda: __import__("data_prep.dedup.driver", fromlist=["x"]).band_params(
                cfg.dedup.threshold, cfg.dedup.num_perm
            )
        )
        t0 = time.perf_counter()
        run_dedup(cfg, paths, chunk_ids, docs, dask_map(client))
        return time.perf_counter() - t0


def datatrove_vs_bloomline(corpus: Path, mb: float, wd: Path) -> None:
    from importlib.metadata import version

    from tests.support.datatrove_baseline import check_xxhash, run_timed, spm_to_tokenizers

    check_xxhash()
    model = wd / "like-for-like-tokenizer" / "tokenizer.model"
    if not model.exists():  # a tokenizer trained once, given to both sides
        res, _, _ = prepare(
            REPO,
            corpus,
            wd / "tok-run",
            ["tokenizer.sample_bytes=20000000", "dedup.near=false", "langid.enabled=false", "pii.enabled=false"],
        )
        model.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wd / "tok-run" / "tokenizer" / "tokenizer.model", model)
        shutil.rmtree(wd / "tok-run")
    same = [f"tokenizer.model={model}", "langid.enabled=false", "pii.enabled=false", f"dask.n_workers={WORKERS}"]
    res, _, m = prepare(REPO, corpus, wd / "bloomline-like", same)
    tok_json = spm_to_tokenizers(model, wd / "tokenizer.json")
    shutil.rmtree(wd / "datatrove", ignore_errors=True)
    dsec, d = run_timed(corpus, wd / "datatrove", tok_json, WORKERS)
    print(f"\nsame steps on the corpus ({mb:,.0f} MB; quality filter, MinHash dedup, tokenization; {WORKERS} workers):")
    print(
        f"  bloomline prepare             {res.seconds:7.1f} s  {m['totals']['docs_in'] / res.seconds:8,.0f} docs/s  "
        f"{mb / res.seconds:5.2f} MB/s  kept {m['totals']['docs_kept']:,}"
    )
    print(
        f"  datatrove {version('datatrove'):10s}          {dsec:7.1f} s  {d['documents'] / dsec:8,.0f} docs/s  "
        f"{mb / dsec:5.2f} MB/s  kept {d['kept']:,}"
    )
    print(f"  bloomline is {dsec / res.seconds:.2f}× faster (target ≥ 3)")


def manifest_at(n_shards: int, m: dict, wd: Path) -> None:
    from bloomline.io import write_json_atomic
    from data_prep.storage.shards import load_manifest

    proto = m["shards"][0]
    m["shards"] = [
        {**proto, "path": f"shards/train/xx/xx-b{i % 4:05d}-p{i:05d}.arrow", "sha256": f"{i:064x}"}
        for i in range(n_shards)
    ]
    d = wd / "manifest-test"
    d.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    write_json_atomic(d / "manifest.json", m)
    tw = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_manifest(d)
    tl = time.perf_counter() - t0
    size = (d / "manifest.json").stat().st_size
    print(
        f"\nmanifest.json with {n_shards:,} shards: {size / 1e6:.1f} MB, written in {tw:.2f} s, loaded and checked in {tl:.2f} s"
    )


def many_files(counts: list[int], wd: Path, repo: Path) -> None:
    """Section 7: ``prepare`` over many small inputs of mixed formats (a third each JSONL,
    JSONL.gz, Parquet), the same 40 MB of grown documents cut into each count of files: plan
    seconds, wall seconds, the driver's peak RSS, Dask tasks by function (run_stats.json) and
    Prefect task runs (counted in the database of a Prefect home of its own)."""
    import gzip
    import sqlite3

    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = wd / "corpus-many"
    grow(corpus, 40)
    docs = [line for f in sorted(corpus.glob("*.jsonl")) for line in f.read_text(encoding="utf-8").splitlines() if line]
    rows = []
    for n in counts:
        inputs = wd / f"many-{n}"
        if not (inputs / "done").exists():
            shutil.rmtree(inputs, ignore_errors=True)
            inputs.mkdir(parents=True)
            for i in range(n):
                part = docs[i::n]
                kind = ("jsonl", "jsonl.gz", "parquet")[i % 3]
                f = inputs / f"f{i:06d}.{kind}"
                if kind == "jsonl":
                    f.write_text("\n".join(part) + "\n", encoding="utf-8")
                elif kind == "jsonl.gz":
                    f.write_bytes(gzip.compress(("\n".join(part) + "\n").encode()))
                else:
                    pq.write_table(pa.Table.from_pylist([json.loads(x) for x in part]), f)
            (inputs / "done").touch()
        home = wd / f"prefect-home-{n}"
        shutil.rmtree(home, ignore_errors=True)
        os.environ["PREFECT_HOME"] = str(home)
        try:
            res, stats, m = prepare(repo, inputs, wd / f"out-many-{n}", [f"dask.n_workers={WORKERS}"])
        finally:
            os.environ.pop("PREFECT_HOME")
        with sqlite3.connect(home / "prefect.db") as db:
            prefect_tasks = db.execute("select count(*) from task_run").fetchone()[0]
        rows.append(
            (
                n,
                len(docs),
                stats["plan"]["seconds"],
                res.seconds,
                res.peak("driver"),
                res.peak("worker"),
                sum(stats["tasks"].values()),
                stats["tasks"],
                prefect_tasks,
                m["totals"]["input_records"],
            )
        )
        print(
            f"  {n:,} files: plan {stats['plan']['seconds']:.1f} s, whole run {res.seconds:.0f} s, driver "
            f"{res.peak('driver'):,.0f} MiB, Dask tasks {sum(stats['tasks'].values()):,} {stats['tasks']}, "
            f"Prefect task runs {prefect_tasks}",
            flush=True,
        )
    print(
        "\n| input files | documents | plan s | wall s | peak RSS driver MiB | largest worker MiB | Dask tasks | Prefect task runs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n, _d, plan_s, wall, drv, wrk, tasks, _, pt, recs in rows:
        print(f"| {n:,} | {recs:,} | {plan_s:.1f} | {wall:.0f} | {drv:,.0f} | {wrk:,.0f} | {tasks:,} | {pt} |")
    if len(rows) > 1:
        print(f"\ndriver peak at {rows[-1][0]:,} files over at {rows[0][0]:,}: {rows[-1][4] / rows[0][4]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-mb", type=float, default=256)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-scale"))
    ap.add_argument("--repo", type=Path, default=REPO)
    ap.add_argument("--skip-speedup", action="store_true")
    ap.add_argument("--skip-datatrove", action="store_true")
    ap.add_argument("--skip-manifest", action="store_true")
    ap.add_argument("--dedup-only", action="store_true", help="only section 3, on the chunk files of earlier runs")
    ap.add_argument(
        "--proto",
        type=Path,
        help="with --comparisons-only: a prepared folder whose manifest the 100,000-shard one copies",
    )
    ap.add_argument(
        "--comparisons-only",
        action="store_true",
        help="only datatrove's same steps and the 100,000-shard manifest, on the corpus and output of earlier runs",
    )
    ap.add_argument(
        "--many-files",
        default="1000,10000",
        help="section 7's counts of small input files (with --many-files-only: only that section)",
    )
    ap.add_argument("--many-files-only", action="store_true")
    args = ap.parse_args()
    wd: Path = args.workdir
    if args.many_files_only:
        many_files([int(x) for x in args.many_files.split(",")], wd, args.repo)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    other = args.repo.resolve() != REPO
    rows = []
    if args.comparisons_only:
        from data_prep.storage.shards import load_manifest

        k = 4 if 4 in sizes else sizes[0]
        if not args.skip_manifest:  # any finished output's manifest serves as the prototype of its entries
            manifest_at(100_000, load_manifest(args.proto or wd / f"out-x{k}"), wd)
        if not args.skip_datatrove:
            datatrove_vs_bloomline(wd / f"corpus-x{k}", args.base_mb * k, wd / "like-for-like")
        return
    if args.dedup_only:
        for k in sizes:
            t1, t2 = dedup_alone(wd / f"out-x{k}", 1, run_config()), dedup_alone(wd / f"out-x{k}", 2, run_config())
            print(
                f"dedup pass alone ×{k}: 1 worker {t1:.1f} s, 2 workers {t2:.1f} s, speed-up {t1 / t2:.2f} (target ≥ 1.6)"
            )
        return
    for k in sizes:
        corpus = wd / f"corpus-x{k}"
        g = grow(corpus, args.base_mb * k)
        print(f"corpus ×{k}: {g['documents']:,} documents, {g['bytes'] / 1e6:,.0f} MB", flush=True)
        res, stats, m = prepare(args.repo, corpus, wd / f"out-x{k}", OVERRIDES)
        dd = stats.get("dedup", {}).get("seconds")
        row = {
            "k": k,
            "docs": g["documents"],
            "mb": g["bytes"] / 1e6,
            "s": res.seconds,
            "driver": res.peak("driver"),
            "worker": res.peak("worker"),
            "server": res.peak("prefect-server"),
            "workers": res.count("worker"),
            "dedup": dd,
            "dups": sum(m["stages"]["dedup"]["duplicates"].values()),
        }
        if not (args.skip_speedup or other):
            row["dedup1"] = dedup_alone(wd / f"out-x{k}", 1, m["config"])
            row["dedup2"] = dedup_alone(wd / f"out-x{k}", 2, m["config"])
        rows.append(row)
        print(
            f"  prepare ×{k}: {res.seconds:.1f} s, {row['docs'] / res.seconds:,.0f} docs/s, {row['mb'] / res.seconds:.2f} MB/s; "
            f"peak RSS driver {row['driver']:,.0f} MiB, largest of {row['workers']} workers {row['worker']:,.0f} MiB, "
            f"prefect server {row['server']:,.0f} MiB; dedup pass {dd:.1f} s, {row['dups']:,} duplicates",
            flush=True,
        )
        if "dedup1" in row:
            print(
                f"  dedup pass alone: 1 worker {row['dedup1']:.1f} s, 2 workers {row['dedup2']:.1f} s, "
                f"speed-up {row['dedup1'] / row['dedup2']:.2f} (target ≥ 1.6)",
                flush=True,
            )
    print(
        "\n| size | documents | MB | wall s | docs/s | MB/s | peak RSS driver MiB | peak RSS largest worker MiB | "
        "dedup pass s | dedup 1 → 2 workers |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sp = f"{r['dedup1']:.1f} → {r['dedup2']:.1f} s (×{r['dedup1'] / r['dedup2']:.2f})" if "dedup1" in r else "-"
        print(
            f"| {r['k']}× | {r['docs']:,} | {r['mb']:,.0f} | {r['s']:.0f} | {r['docs'] / r['s']:,.0f} | {r['mb'] / r['s']:.2f} | "
            f"{r['driver']:,.0f} | {r['worker']:,.0f} | {r['dedup']:.1f} | {sp} |"
        )
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(
            f"\nflatness, peak at {b['k']}× over peak at {a['k']}× (target ≤ 1.25): driver {b['driver'] / a['driver']:.2f}, "
            f"largest worker {b['worker'] / a['worker']:.2f}, prefect server {b['server'] / max(a['server'], 1):.2f}"
        )
    if not (args.skip_datatrove or other):
        k = 4 if 4 in sizes else sizes[0]
        datatrove_vs_bloomline(wd / f"corpus-x{k}", args.base_mb * k, wd / "like-for-like")
    if not (args.skip_manifest or other):
        manifest_at(100_000, m, wd)


if __name__ == "__main__":
    main()
