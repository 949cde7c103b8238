"""Benchmark of `bloomline prepare` on ../shared/corpus (run by hand; prints figures).

    python -m bench.prepare_throughput [--scale 16] [--workdir /tmp/bloomline-bench]

What it measures, all in one run so the ratios compare like with like:

1. Peak RSS of ``bloomline prepare`` (the whole process tree: CLI, Dask workers, temporary
   Prefect server; sampled every 0.1 s) on the corpus ×1 and ×4, with the full pipeline
   (dedup on: the ×4 copies are found as duplicates) and with dedup off (every stage sees 4×
   the data). Target: ×4 / ×1 ≤ 1.2.
2. Throughput JSONL in → tokens out on the corpus replicated to ≥ 200 MB, in tokens/s, the same
   span on every side: ``bloomline prepare`` with every filter and dedup off and a given
   tokenizer (the whole CLI run: reading, parsing, tokenizing, packing, writing shards, its
   temporary Prefect server included), next to
   * the limit: SentencePiece batch encoding of the same texts with the same model on the same
     number of cores (``encode(texts, num_threads=N)``), no I/O, no parsing — an upper bound;
   * a baseline in the style of Megatron-LM ``tools/preprocess_data.py``: a multiprocessing pool
     of N workers reading the JSONL, one JSON line per call (chunksize 25, as Megatron), same
     tokenizer, the result appended to a .bin/.idx pair — target: slower than ours.
   All three produce the same number of tokens (checked; PII redaction is off for this run, since
   the others do not redact).
3. Padding waste of the packed train shards: Σ(bucket − length) / Σ bucket — target < 3%.
4. The whole run, JSONL in → shards out, on the corpus ×1 (``--whole-only`` runs just this):
   ``bloomline prepare`` (wall time of the CLI, its temporary Prefect server included; quality
   filters, exact + MinHash dedup, tokenization with a given tokenizer, packing; PII and langid
   off, which the others lack) against a **datatrove** pipeline of the same steps with the same
   number of workers (tests/support/datatrove_baseline.py: JsonlReader, GopherQualityFilter, MinHash
   dedup with 128 hashes, DocumentTokenizer with the same tokenizer in its ``tokenizers`` form,
   checked to give SentencePiece's ids on every document), the Megatron-style baseline (reads,
   parses, encodes, writes: the same span) and the SentencePiece limit (encode only). docs/s and
   MB/s are of the input, tokens/s of the tokens written.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from bench.repo import REPO, SHARED, cli_command, repo_env
from bloomline.host import available_cpus
from data_prep.steps.normalize import normalize_text

CORES = available_cpus()

BASE_OVERRIDES = [
    "tokenizer.vocab_size=32000",
    "tokenizer.sample_bytes=20000000",
    "pack.buckets=[256,512,1024,2048]",
    "pack.valid_fraction=0.01",
    f"dask.n_workers={CORES}",
]


def replicate(dst: Path, times: int) -> int:
    """Write the corpus `times` over into dst (one JSONL per source file and copy); bytes of text."""
    dst.mkdir(parents=True, exist_ok=True)
    total = 0
    files = sorted(SHARED.rglob("*.jsonl"))
    for k in range(times):
        for f in files:
            out = dst / f"{f.parent.name}-{f.stem}-r{k:02d}.jsonl"
            if not out.exists():
                lines = f.read_text(encoding="utf-8").splitlines()
                with open(out, "w", encoding="utf-8") as w:
                    for line in lines:
                        rec = json.loads(line)
                        rec["id"] = f"{rec['id']}-r{k}"
                        # Written normalized, so the limit and the baseline (which do not
                        # normalize) tokenize exactly the text bloomline tokenizes.
                        rec["text"] = normalize_text(rec["text"])
                        w.write(json.dumps(rec, ensure_ascii=False) + "\n")
            total += sum(len(json.loads(l)["text"].encode()) for l in out.read_text(encoding="utf-8").splitlines())
    return total


def run_prepare(inputs: Path, out: Path, overrides: list[str]) -> tuple[float, float, dict]:
    """Run the CLI, sampling the RSS of its process tree; returns (peak MiB, seconds, run_stats)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = cli_command(
        "prepare",
        "--out",
        out,
        inputs,
        "--config",
        REPO / "configs/data/demo.yaml",
        *[x for o in [*BASE_OVERRIDES, *overrides] for x in ("-o", o)],
    )
    t0 = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=repo_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    peak = 0
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.1)
    reader.join()
    dt = time.time() - t0
    if proc.returncode != 0:
        print("".join(err[-40:]), file=sys.stderr)
        raise SystemExit(f"prepare failed ({proc.returncode})")
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return peak / 2**20, dt, json.loads((out / "run_stats.json").read_text())


def load_texts(folder: Path) -> list[str]:
    texts = []
    for f in sorted(folder.glob("*.jsonl")):
        texts.extend(json.loads(l)["text"] for l in f.read_text(encoding="utf-8").splitlines())
    return texts


def limit_tokens_per_s(model: str, texts: list[str]) -> tuple[float, int]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model)
    n = 0
    t0 = time.perf_counter()
    for i in range(0, len(texts), 4096):
        for ids in sp.encode(texts[i : i + 4096], num_threads=CORES):
            n += len(ids) + 1  # + </s>, as written by both pipelines
    return n / (time.perf_counter() - t0), n


# --- Megatron-style baseline (tools/preprocess_data.py: Pool.imap over lines, chunksize 25) -----
_SP = None


def _init(model: str) -> None:
    global _SP
    import sentencepiece as spm

    _SP = spm.SentencePieceProcessor(model_file=model)


def _encode(line: str) -> np.ndarray:
    ids = _SP.encode(json.loads(line)["text"])
    ids.append(_SP.eos_id())
    return np.asarray(ids, dtype=np.int32)


def baseline_tokens_per_s(model: str, folder: Path, out: Path) -> tuple[float, int]:
    files = sorted(folder.glob("*.jsonl"))
    t0 = time.perf_counter()
    n = 0
    sizes = []
    with open(out / "baseline.bin", "wb") as bin_f, mp.Pool(CORES, initializer=_init, initargs=(model,)) as pool:
        for f in files:
            with open(f, encoding="utf-8") as fin:
                for arr in pool.imap(_encode, fin, chunksize=25):
                    bin_f.write(arr.tobytes())
                    sizes.append(len(arr))
                    n += len(arr)
    np.asarray(sizes, dtype=np.int32).tofile(out / "baseline.idx")
    return n / (time.perf_counter() - t0), n


def whole_run(x1: Path, nbytes: int, wd: Path, model: str) -> None:
    """Section 4: four ways from the same JSONL files to tokens, the whole span timed."""
    from importlib.metadata import version

    import sentencepiece as spm
    from tokenizers import Tokenizer

    from tests.support.datatrove_baseline import run_timed, spm_to_tokenizers

    tok_json = spm_to_tokenizers(model, wd / "tokenizer.json")
    sp, fast = spm.SentencePieceProcessor(model_file=model), Tokenizer.from_file(str(tok_json))
    texts = load_texts(x1)
    differ = sum(sp.encode(t) != fast.encode(t, add_special_tokens=False).ids for t in texts)
    if differ:
        raise SystemExit(f"the tokenizers form differs from SentencePiece on {differ} of {len(texts)} documents")
    rows = []
    _, secs, _ = run_prepare(
        x1, wd / "out-whole", ["pii.enabled=false", "langid.enabled=false", f"tokenizer.model={model}"]
    )
    tot = json.loads((wd / "out-whole" / "manifest.json").read_text())["totals"]
    tokens = json.loads((wd / "out-whole" / "run_stats.json").read_text())["pack"]["tokens"]
    rows.append(("bloomline prepare (whole CLI run)", secs, tot["docs_in"], tot["docs_kept"], tokens))
    shutil.rmtree(wd / "datatrove", ignore_errors=True)
    secs, dt = run_timed(x1, wd / "datatrove", tok_json, CORES)
    rows.append(
        (f"datatrove {version('datatrove')} ({CORES} workers)", secs, dt["documents"], dt["kept"], dt["tokens"])
    )
    t0 = time.perf_counter()
    _, n = baseline_tokens_per_s(model, x1, wd)
    rows.append(
        (
            "Megatron-style preprocess_data (read+parse+encode+write)",
            time.perf_counter() - t0,
            len(texts),
            len(texts),
            n,
        )
    )
    t0 = time.perf_counter()
    _, n = limit_tokens_per_s(model, texts)
    rows.append(
        (f"SentencePiece encode(num_threads={CORES}), no I/O", time.perf_counter() - t0, len(texts), len(texts), n)
    )
    print(f"whole run on the corpus ×1 ({len(texts):,} documents, {nbytes / 1e6:.1f} MB):")
    for name, sec, docs, kept, toks in rows:
        print(
            f"  {name:58s} {sec:6.1f} s  {docs / sec:8,.0f} docs/s  {nbytes / 1e6 / sec:6.2f} MB/s  "
            f"{toks / sec:10,.0f} tokens/s  (kept {kept:,} docs, {toks:,} tokens)"
        )
    print(f"  bloomline / datatrove wall time: {rows[1][1] / rows[0][1]:.2f}× faster")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=17, help="replication for the throughput run (17 × 12.1 MB ≥ 200 MB)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-bench"))
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--whole-only", action="store_true", help="only section 4")
    args = ap.parse_args()
    args.skip_rss = args.skip_rss or args.whole_only
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found")
    wd = args.workdir
    wd.mkdir(parents=True, exist_ok=True)
    print(f"cores: {CORES}")

    # 1. RSS on ×1 and ×4 -----------------------------------------------------------------
    x1 = wd / "x1"
    x4 = wd / "x4"
    b1 = replicate(x1, 1)
    b4 = replicate(x4, 4)
    print(f"corpus ×1: {b1 / 1e6:.1f} MB of text, ×4: {b4 / 1e6:.1f} MB")
    model = wd / "out-x1" / "tokenizer" / "tokenizer.model"
    if not args.skip_rss or not model.exists():
        rss1, t1, st1 = run_prepare(x1, wd / "out-x1", [])
        print(f"prepare ×1 (full pipeline): peak RSS {rss1:,.0f} MiB, {t1:.0f} s")
    if not args.skip_rss:
        rss4, t4, _ = run_prepare(x4, wd / "out-x4", [])
        print(f"prepare ×4 (full pipeline): peak RSS {rss4:,.0f} MiB, {t4:.0f} s   ratio ×4/×1 = {rss4 / rss1:.2f}")
        nodedup = ["dedup.exact=false", "dedup.near=false", f"tokenizer.model={model}"]
        r1, t1n, _ = run_prepare(x1, wd / "out-x1-nodedup", nodedup)
        r4, t4n, _ = run_prepare(x4, wd / "out-x4-nodedup", nodedup)
        print(
            f"prepare, dedup off, tokenizer reused: ×1 {r1:,.0f} MiB ({t1n:.0f} s), ×4 {r4:,.0f} MiB ({t4n:.0f} s)"
            f"   ratio = {r4 / r1:.2f}"
        )

    whole_run(x1, b1, wd, str(model))
    if args.whole_only:
        return

    # 2. throughput of tokenize+pack+write on ≥200 MB ----------------------------------------
    big = wd / f"x{args.scale}"
    bb = replicate(big, args.scale)
    print(f"throughput corpus: ×{args.scale} = {bb / 1e6:.0f} MB of text")
    fast = [
        "dedup.exact=false",
        "dedup.near=false",
        "langid.enabled=false",
        "filters.enabled=false",
        "pii.enabled=false",
        f"tokenizer.model={model}",
        "pack.part_bytes=33554432",
    ]
    # The machine is shared and noisy: measure the limit before and after our run, use the mean.
    texts = load_texts(big)
    lim_before, _ = limit_tokens_per_s(str(model), texts)
    del texts
    _, tall, stats = run_prepare(big, wd / "out-big", fast)
    ours_tokens = stats["pack"]["tokens"]
    ours = ours_tokens / tall  # the whole CLI run: the span the baseline's figure covers too
    manifest = json.loads((wd / "out-big" / "manifest.json").read_text())
    texts = load_texts(big)
    lim_after, lim_tokens = limit_tokens_per_s(str(model), texts)
    del texts
    lim = (lim_before + lim_after) / 2
    print(f"limit measured before/after: {lim_before:,.0f} / {lim_after:,.0f} tokens/s")
    base, base_tokens = baseline_tokens_per_s(str(model), big, wd)
    print(f"tokens: ours {ours_tokens:,}  limit {lim_tokens:,}  baseline {base_tokens:,}")
    assert ours_tokens == lim_tokens == base_tokens, "the three runs must produce the same tokens"
    print(f"bloomline prepare, JSONL in → shards out ({CORES} Dask workers, {tall:.0f} s): {ours:,.0f} tokens/s")
    print(
        f"limit: SentencePiece encode(num_threads={CORES}), no I/O, no parsing: {lim:,.0f} tokens/s"
        f"   ours/limit = {ours / lim:.2f}"
    )
    print(
        f"baseline: Megatron-style Pool({CORES}).imap, JSONL in → .bin out:   {base:,.0f} tokens/s"
        f"   ours/baseline = {ours / base:.2f} (target > 1)"
    )

    # 3. padding ----------------------------------------------------------------------------
    for name, m in (
        ("×1 full pipeline", json.loads((wd / "out-x1" / "manifest.json").read_text())),
        (f"×{args.scale}", manifest),
    ):
        tr = m["splits"]["train"]
        print(
            f"padding waste of train shards ({name}): {100 * tr['padding_fraction']:.3f}% "
            f"({tr['rows']:,} samples, buckets {m['buckets']})"
        )


if __name__ == "__main__":
    main()
