"""How far `bloomline prepare` is from this machine's floor (run by hand; prints figures).

    python -m bench.prepare_floor [--base-mb 16] [--sizes 1,4,16] [--workdir /tmp/bloomline-floor]
                                  [--steps-only] [--startup-only] [--datatrove]

The floor is what ``prepare`` must do anyway: read the records and SentencePiece-encode their
text with the run's tokenizer, one process per core, nothing else. Per size of a corpus grown
as ``bench/scale.py`` grows it (per-language Markov walks of ../shared/corpus, 4% duplicates
put back; ``--base-mb`` × each size):

1. The whole ``bloomline prepare`` (the CLI, its temporary Prefect server, a Dask cluster of 2
   workers, the full default recipe: language ID and PII on, quality filters, exact + MinHash
   dedup, a tokenizer trained on 20 MB, packing), timed from outside.
2. The floor on the same corpus with that run's tokenizer: a pool of one process per core
   reads each JSONL line (orjson), SentencePiece-encodes the text in batches of 512 (one
   thread, its numpy output: the fastest way to get ids, as the pack pass gets them), and
   counts the tokens. Also the SentencePiece-only rate (the encode seconds alone, per core summed).
3. MB/s of both, the ratio whole ÷ floor (targets ≤ 5, stretch 4), the pack pass's rate over
   the SentencePiece-only rate (target ≥ 0.7; PII redaction included), and the stage seconds.

``--steps-only``: each per-document step alone, one process, bloomline's own code, on a
``--step-mb`` sample of the 1× corpus (documents from every language): MB/s of its input.
``--startup-only``: ``bloomline prepare`` on a 1 MB input, wall time and the stages' share; then
``bloomline train`` of bloom-tiny for one step on its output (evaluation off) and ``bloomline
evaluate`` of that checkpoint (bits per byte of 2,048 tokens per language): wall times and their
own work's share.
``--datatrove``: at 4×, datatrove 0.10.1 doing the same steps (bench/scale.py's comparison).
``--repo PATH``: the whole runs with another checkout's CLI (before/after).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import shutil
import time
from pathlib import Path

from bench.repo import REPO, cli
from bench.scale import WORKERS, prepare
from tests.support.grow import grow

CORES = 2
OVERRIDES = [  # bench/scale.py's, on the full default recipe (language ID and PII on)
    "tokenizer.sample_bytes=20000000",
    "read.chunk_bytes=4194304",
    f"dask.n_workers={WORKERS}",
]


# -- the floor -------------------------------------------------------------------------------
def _pieces(corpus: Path, size: int = 4 << 20) -> list[tuple[str, int, int]]:
    """The corpus's JSONL files cut into byte ranges of about ``size`` at line starts."""
    out = []
    for f in sorted(corpus.glob("*.jsonl")):
        n, start = f.stat().st_size, 0
        with open(f, "rb") as fh:
            while start < n:
                fh.seek(min(n, start + size))
                fh.readline()
                end = min(n, fh.tell()) if start + size < n else n
                out.append((str(f), start, end))
                start = end
    return out


_SP = None


def _floor_init(model: str) -> None:
    global _SP
    import sentencepiece as spm

    _SP = spm.SentencePieceProcessor(model_file=model, num_threads=1)  # one process per core


def _floor_piece(piece: tuple[str, int, int]) -> tuple[int, int, float, float]:
    """(bytes of text, tokens, read+parse seconds, encode seconds) of one byte range."""
    import orjson

    path, start, end = piece
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        fh.seek(start)
        texts = [orjson.loads(line)["text"] for line in fh.read(end - start).splitlines() if line.strip()]
    t1 = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 512):
        tokens += sum(map(len, _SP.encode(texts[i : i + 512], return_type="numpy")))
    t2 = time.perf_counter()
    return sum(len(t.encode("utf-8")) for t in texts), tokens, t1 - t0, t2 - t1


def floor(corpus: Path, model: Path) -> dict:
    """Wall seconds of reading + encoding the corpus with one process per core."""
    pieces = _pieces(corpus)
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(CORES, initializer=_floor_init, initargs=(str(model),)) as pool:
        res = pool.map(_floor_piece, pieces, chunksize=1)
    wall = time.perf_counter() - t0
    return {
        "seconds": wall,
        "text_bytes": sum(r[0] for r in res),
        "tokens": sum(r[1] for r in res),
        "encode_seconds": sum(r[3] for r in res),
        "cpu": sum(r[2] + r[3] for r in res),
    }


# -- each step alone -------------------------------------------------------------------------
def sample_docs(corpus: Path, mb: float) -> Path:
    """A JSONL of about ``mb`` MB: the same share of every language file, from its start."""
    files = sorted(corpus.glob("*.jsonl"))
    total = sum(f.stat().st_size for f in files)
    out = corpus.parent / f"step-sample-{mb:g}mb.jsonl"
    with open(out, "wb") as w:
        for f in files:
            want = f.stat().st_size * mb * 1e6 / total
            got = 0
            with open(f, "rb") as fh:
                for line in fh:
                    if got >= want:
                        break
                    w.write(line)
                    got += len(line)
    return out


def steps_alone(corpus: Path, mb: float, tokenizer: Path | None) -> list[tuple[str, float, float]]:
    """(step, input MB, MB/s) of each per-document step run alone over the sample, in order."""
    from data_prep.config import PrepareConfig
    from data_prep.inputs.chunk_plan import Chunk
    from data_prep.inputs.readers import ChunkReader
    from data_prep.passes.chunks import chunk_steps
    from data_prep.steps.document import Ledger
    from data_prep.steps.minhash import DedupSigner, exact_key, minhasher, shingle_hashes
    from data_prep.steps.pii import PIIRedactor
    from data_prep.storage.droplog import DropLog
    from data_prep.storage.workdir import Paths

    cfg = PrepareConfig()
    path = sample_docs(corpus, mb)
    ledger = Ledger(DropLog(cfg.dropped_text_chars))
    rows = []

    def timed(name, fn, docs):
        nbytes = sum(len(d.text.encode("utf-8")) for d in docs)
        t0 = time.perf_counter()
        out = fn(docs)
        s = time.perf_counter() - t0
        rows.append((name, nbytes / 1e6, nbytes / 1e6 / s))
        print(f"  {name:24s} {nbytes / 1e6:7.1f} MB  {nbytes / 1e6 / s:7.2f} MB/s", flush=True)
        return out

    t0 = time.perf_counter()
    reader = ChunkReader(Chunk(id=0, path=str(path), fmt="jsonl", size=path.stat().st_size), cfg.read, ledger)
    docs = list(reader.run())
    s = time.perf_counter() - t0
    rows.append(("read", path.stat().st_size / 1e6, path.stat().st_size / 1e6 / s))
    print(f"  {'read':24s} {path.stat().st_size / 1e6:7.1f} MB  {rows[-1][2]:7.2f} MB/s (of the JSONL)", flush=True)
    paths = Paths(corpus.parent / "step-out")
    for name, build in chunk_steps(cfg, paths):
        step = build(ledger, False)
        if name == "dedup_sign":  # its parts first, on the same documents
            from bloomline import languages

            han = [languages.BY_CODE[d.lang].script in ("Hans", "Hant") for d in docs]
            B = DedupSigner.batch_size  # shingled a batch at a time, as the step does
            timed("  exact_key", lambda ds: [exact_key(d.text) for d in ds], docs)
            hashes = timed(
                "  shingle_hashes",
                lambda ds: [
                    h
                    for i in range(0, len(ds), B)
                    for h in shingle_hashes([d.text for d in ds[i : i + B]], cfg.dedup.shingle_words, han[i : i + B])
                ],
                docs,
            )
            signer = minhasher(cfg.dedup.num_perm)
            timed("  signatures (batched)", lambda ds: signer.signatures([h for h in hashes if len(h)]), docs)
        docs = timed(name, lambda ds: list(step.run(ds)), docs)
    docs = timed("pii", lambda ds: list(PIIRedactor(cfg.pii, ledger).run(ds)), docs)
    if tokenizer is not None:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
        texts = [d.text for d in docs]
        timed(
            "encode (SentencePiece, 1 thread)",
            lambda ds: [
                sp.encode(texts[i : i + 512], num_threads=1, return_type="numpy") for i in range(0, len(texts), 512)
            ],
            docs,
        )
    return rows


# -- the whole run ---------------------------------------------------------------------------
def whole(corpus: Path, out: Path, repo: Path = REPO) -> dict:
    res, stats, manifest = prepare(repo, corpus, out, OVERRIDES)
    kept = sum(v.get("bytes", 0) for v in manifest["languages"].values()) if "languages" in manifest else None
    return {"seconds": res.seconds, "stats": stats, "manifest": manifest, "kept_bytes": kept, "res": res}


def startup(wd: Path, repo: Path = REPO) -> None:
    """``prepare`` on a 1 MB input: the wall time, and what of it is not the stages' own work."""
    corpus = wd / "corpus-1mb"
    if not corpus.exists():
        corpus.mkdir(parents=True)
        sample = sample_docs(wd / "corpus-x1", 1.0)
        sample.rename(corpus / "sample.jsonl")
    r = whole(corpus, wd / "out-1mb", repo)
    st = r["stats"]
    inner = sum(st.get(k, {}).get("seconds", 0) for k in ("plan", "chunks", "tokenizer", "dedup", "pack"))
    print(
        f"prepare on 1 MB: wall {r['seconds']:.1f} s; stages {inner:.1f} s "
        f"(plan {st['plan']['seconds']:.1f}, chunks {st['chunks']['seconds']:.1f}, tokenizer {st['tokenizer']['seconds']:.1f}, "
        f"dedup {st['dedup']['seconds']:.1f}, pack {st['pack']['seconds']:.1f}); the rest {r['seconds'] - inner:.1f} s "
        f"(target: wall ≤ 10 s)"
    )
    run = wd / "run-1mb"
    shutil.rmtree(run, ignore_errors=True)
    t0 = time.time()
    train = ["--data", wd / "out-1mb", "--out", run, "-o", "train.steps=1", "-o", "checkpoint.interval=1"]
    cli("train", *train, "-o", "evaluation.enabled=false", repo=repo, DS_ACCELERATOR="cpu")
    wall = time.time() - t0
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    print(
        f"train, bloom-tiny, 1 step, evaluation off: wall {wall:.1f} s; the step ended {step['time'] - t0:.1f} s after "
        f"launch (the step itself {step['step_seconds']:.1f} s), the rest {wall - (step['time'] - t0):.1f} s (checkpoint, "
        "shut-down)"
    )
    t0 = time.time()
    evaluate = ["--checkpoint", run / "checkpoints" / "step_1", "--data", wd / "out-1mb"]
    out = cli(
        "evaluate", *evaluate, "-o", "tasks=[]", "-o", "max_tokens_per_lang=2048", repo=repo, DS_ACCELERATOR="cpu"
    )
    wall = time.time() - t0
    inner = float(re.search(r"tokens in ([\d.]+) s", out).group(1))
    print(f"evaluate, bits per byte only, 2,048 tokens per language: wall {wall:.1f} s; the evaluation {inner:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-mb", type=float, default=16)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-floor"))
    ap.add_argument("--step-mb", type=float, default=8)
    ap.add_argument("--steps-only", action="store_true")
    ap.add_argument("--startup-only", action="store_true")
    ap.add_argument("--datatrove", action="store_true")
    ap.add_argument("--repo", type=Path, default=REPO, help="run another checkout's CLI (a before/after comparison)")
    args = ap.parse_args()
    wd: Path = args.workdir
    wd.mkdir(parents=True, exist_ok=True)
    grow(wd / "corpus-x1", args.base_mb)
    if args.startup_only:
        startup(wd, args.repo)
        return
    if args.steps_only:
        model = wd / "out-x1" / "tokenizer" / "tokenizer.model"
        print(f"each step alone, one process, on {args.step_mb:g} MB of the 1× corpus:")
        steps_alone(wd / "corpus-x1", args.step_mb, model if model.exists() else None)
        return
    rows = []
    for k in [int(s) for s in args.sizes.split(",")]:
        corpus = wd / f"corpus-x{k}"
        g = grow(corpus, args.base_mb * k)
        mb = g["bytes"] / 1e6
        r = whole(corpus, wd / f"out-x{k}", args.repo)
        f = floor(corpus, wd / f"out-x{k}" / "tokenizer" / "tokenizer.model")
        st = r["stats"]
        sp_rate = f["text_bytes"] / 1e6 / (f["encode_seconds"] / CORES)
        pack_mb = r["manifest"]["totals"].get("kept_bytes") or r["kept_bytes"] or 0
        row = {
            "k": k,
            "mb": mb,
            "whole": r["seconds"],
            "floor": f["seconds"],
            "sp_rate": sp_rate,
            "pack_rate": pack_mb / 1e6 / st["pack"]["seconds"] if pack_mb else float("nan"),
            "stages": {s: st[s]["seconds"] for s in ("plan", "chunks", "tokenizer", "dedup", "pack")},
            "driver": r["res"].peak("driver"),
            "worker": r["res"].peak("worker"),
            "cpu": {role: r["res"].cpu_of(role) for role in ("driver", "worker", "prefect-server", "other")},
        }
        rows.append(row)
        print(
            f"×{k} ({mb:,.0f} MB): whole {row['whole']:.1f} s ({mb / row['whole']:.2f} MB/s), floor {row['floor']:.1f} s "
            f"({mb / row['floor']:.2f} MB/s), ratio {row['whole'] / row['floor']:.2f}; pack pass "
            f"{row['pack_rate']:.2f} MB/s = {row['pack_rate'] / sp_rate:.2f}× SentencePiece-only ({sp_rate:.2f} MB/s); "
            f"stages {json.dumps({s: round(v, 1) for s, v in row['stages'].items()})}; peak RSS driver "
            f"{row['driver']:,.0f} MiB, largest worker {row['worker']:,.0f} MiB; CPU s "
            f"{json.dumps({k: round(v, 1) for k, v in row['cpu'].items()})} (floor {f['cpu']:.1f})",
            flush=True,
        )
    print(
        "\n| size | MB | whole s | MB/s | floor s | floor MB/s | whole ÷ floor | pack ÷ SentencePiece | driver MiB | worker MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['k']}× | {r['mb']:,.0f} | {r['whole']:.1f} | {r['mb'] / r['whole']:.2f} | {r['floor']:.1f} | "
            f"{r['mb'] / r['floor']:.2f} | {r['whole'] / r['floor']:.2f} | {r['pack_rate'] / r['sp_rate']:.2f} | "
            f"{r['driver']:,.0f} | {r['worker']:,.0f} |"
        )
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(
            f"\nflatness, peak at {b['k']}× over at {a['k']}× (target ≤ 1.25): driver {b['driver'] / a['driver']:.2f}, "
            f"largest worker {b['worker'] / a['worker']:.2f}"
        )
    if args.datatrove:
        from bench.scale import datatrove_vs_bloomline

        datatrove_vs_bloomline(wd / "corpus-x4", args.base_mb * 4, wd / "like-for-like")


if __name__ == "__main__":
    main()
