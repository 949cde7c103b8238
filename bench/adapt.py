"""Benchmark of starting from an existing BLOOM (run by hand; prints figures).

    python -m bench.adapt [--seeds 3] [--base-steps 400] [--steps 100] [--workdir /tmp/bloomline-adapt]
    python -m bench.adapt --smoke      (a few minutes: fewer languages and steps, 1 seed)

The question: given a trained BLOOM, how should one teach it languages it was not trained on?
A "base" bloom-tiny is trained on base languages with its own byte-level BPE
(``tokenizer.kind=byte_bpe``) and exported as a Hugging Face folder: the existing BLOOM. It is
then trained on the held-back languages only, in three arms of the same steps and tokens per
step (an equal *token* budget: a tokenizer that packs more bytes per token sees more text):

* ``base-tok``: the held-back text in the base tokenizer, weights from the export;
* ``extended``: the base tokenizer grown by ``--extend`` tokens learned on the held-back text
  (``tokenizer.extend_with``), new rows the mean of their base pieces;
* ``scratch``: the data of ``base-tok``, fresh weights.

Every arm's final checkpoint, and the base model itself (step 0 of ``base-tok``), is evaluated
on test text of the held-back and base languages taken from *other sources* than any training
text (NTREX news where a language has it; the split is printed), prepared with the arm's
tokenizer. Bits per byte divide by the text's bytes, so they compare across tokenizers; the
continuation task's items are cut in tokens, so its accuracy compares exactly only between arms
of one tokenizer. Reported, mean ± sd over seeds: held-back bpb and accuracy, base-language bpb
and its change from the base model (forgetting), and each tokenizer's tokens per byte.

Then the tokenizer library itself: ``tokenizers`` (BLOOM's byte-level BPE) against SentencePiece
(BPE, byte fallback, bloomline's settings), both trained on one sample file of the base corpus's
lines at the same vocabulary, one thread each: training seconds, encode MB/s on one core
(bloomline's ``Tokenizer.encode_batch`` for both, over the same test texts) and tokens per byte
per language.

Tables are Markdown; every figure goes to ``WORKDIR/report.json``. Finished steps are not redone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.mixture_arms import run_arm
from bench.repo import REPO, SHARED, cli
from bloomline import languages

# Held back from the base model, one reason each: sw (Bantu; its relatives zu and rw are in the
# base), yo (tonal diacritics; Igbo is in the base), ta (Tamil script: no base language writes
# it, so the base tokenizer falls back to bytes), vi (Latin with stacked diacritics). Three of
# BLOOM's groups (niger-congo, indic, other) and three scripts.
HELD = "sw,yo,ta,vi"
BASE = "en,fr,es,pt,ar,zh-Hans,hi,bn,ur,ig,zu,rw"
TEST_SOURCE = "MicrosoftTranslator/NTREX"
"""The test text's source where a language has it beside others (news, unlike FLORES' wiki text)."""
RECIPE = REPO / "configs/data/demo.yaml"
ALL_TOKENS = 1 << 40  # evaluation.max_tokens_per_lang: all of the test text, the same bytes for every tokenizer
FULL = dict(held=HELD, base=BASE, vocab=8000, extend=1000, base_steps=400, steps=100, seeds=3, test_kb=48, items=50)
SMOKE = dict(held="sw,ta", base="en,hi,zu,ar", vocab=2000, extend=200, base_steps=30, steps=10, seeds=1)
SMOKE.update(test_kb=12, items=20)
ARMS = ("base-tok", "extended", "scratch")


def split_sources(lang: str, test_kb: float) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """A language's documents of ../shared/corpus as (train, test, what came from where): the
    test text is one source's (:data:`TEST_SOURCE`, else the last of several), at most
    ``test_kb``; a language of one source gives every 4th document to test."""
    docs = [json.loads(line) for line in open(SHARED / "text" / f"{lang}.jsonl", encoding="utf-8")]
    sources = sorted({d["source"].split(":")[0] for d in docs})
    if len(sources) == 1:
        train, test, held_out = [d for i, d in enumerate(docs) if i % 4], docs[::4], f"{sources[0]} (every 4th doc)"
    else:
        held_out = TEST_SOURCE if TEST_SOURCE in sources else sources[-1]
        train = [d for d in docs if not d["source"].startswith(held_out + ":")]
        test = [d for d in docs if d["source"].startswith(held_out + ":")]
    kept, size = [], 0
    for d in test:
        if size >= test_kb * 1024:
            break
        kept.append(d)
        size += len(d["text"].encode())
    where = {"train": sorted({d["source"].split(":")[0] for d in train}), "test": held_out, "test_bytes": size}
    return train, kept, where


def write_jsonl(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")


def split_corpus(wd: Path, held: list[str], base: list[str], test_kb: float) -> dict[str, Any]:
    """``wd/corpus/{base,held,test}/<lang>.jsonl``: the base and held-back languages' training
    text, and every language's test text; returns each language's sources."""
    where = {}
    for lang in held + base:
        train, test, where[lang] = split_sources(lang, test_kb)
        write_jsonl(wd / "corpus" / ("held" if lang in held else "base") / f"{lang}.jsonl", train)
        write_jsonl(wd / "corpus" / "test" / f"{lang}.jsonl", test)
    return where


def prepare(src: Path, out: Path, *overrides: str) -> Path:
    """``bloomline prepare`` of ``src`` into ``out`` with the demo recipe and ``overrides`` (once)."""
    if not (out / "manifest.json").exists():
        print(f"preparing {src.name} → {out.name} …", flush=True)
        args: list[object] = ["prepare", "--config", RECIPE, "--out", out, src]
        for o in overrides:
            args += ["-o", o]
        cli(*args, log=out.parent / f"prepare-{out.name}.log", DS_ACCELERATOR="cpu")
    return out


def tokenizer_of(data: Path) -> Path:
    """The tokenizer file of prepared data."""
    return data / json.loads((data / "manifest.json").read_text())["tokenizer"]["path"]


def train(name: str, seed: int, data: Path, out: Path, a: argparse.Namespace, *extra: str, test: Path | None = None):
    """One run of bloom-tiny (bench/mixture_arms.py's ``run_arm``: trained, then its final checkpoint
    evaluated on ``test`` into ``out/test``, or on the data's validation split)."""
    steps = a.base_steps if name == "base" else a.steps
    o = [
        f"batch.tokens_per_step={a.tokens_per_step}",
        "model.vocab_size=null",  # the data's tokenizer's (a grown one included)
        f"optim.warmup_steps={max(1, steps // 10)}",
        *extra,
    ]
    t = time.time()
    run_arm(name, seed, data, out, steps, steps, ALL_TOKENS, None, o, test, a.items, "test")
    print(f"{name} seed {seed}: {time.time() - t:.0f} s", flush=True)


def evaluate(ckpt: Path, data: Path, test: Path, out: Path, items: int) -> None:
    """``ckpt`` (trained on ``data``) evaluated on ``test``'s validation split into ``out`` (once)."""
    if any((out / "eval" / "results").glob("*.parquet")):
        return
    tasks = f"tasks=[{{name: continuation, limit: {items}}}]"
    args = ["evaluate", "--checkpoint", ckpt, "--data", data, "--out", out, "-o", f"heldout={test}", "-o", tasks]
    cli(*args, "-o", "prompts_per_lang=0", log=out.parent / f"{out.name}.log", DS_ACCELERATOR="cpu")


def figures(run: Path, step: int) -> dict[str, dict[str, float]]:
    """Per language: bpb and continuation accuracy of ``run``'s evaluation at ``step``."""
    from eval.results.table import read_results

    rows = [r for r in read_results(run).to_pylist() if r["step"] == step and r["scope"] == "language"]
    pick = {"bpb": ("validation", "bpb"), "acc": ("continuation", "acc")}
    return {k: {r["lang"]: r["value"] for r in rows if (r["task"], r["metric"]) == tm} for k, tm in pick.items()}


def texts_of(folder: Path, langs: list[str]) -> dict[str, list[str]]:
    """Each language's texts in ``folder/<lang>.jsonl``."""
    return {lang: [json.loads(x)["text"] for x in open(folder / f"{lang}.jsonl", encoding="utf-8")] for lang in langs}


def tokens_per_byte(tokenizer: Path, texts: dict[str, list[str]]) -> dict[str, float]:
    """Per language: tokens (no ``</s>``) per UTF-8 byte of its texts."""
    from bloomline.tokenizer import open_tokenizer

    tok = open_tokenizer(tokenizer)
    out = {}
    for lang, docs in texts.items():
        ids = sum(len(x) - 1 for x in tok.encode_batch(docs))
        out[lang] = ids / sum(len(d.encode()) for d in docs)
    return out


def run_base(wd: Path, a: argparse.Namespace) -> Path:
    """The existing BLOOM: bloom-tiny trained on the base languages, exported; its HF folder."""
    data = prepare(
        wd / "corpus" / "base", wd / "data-base", "tokenizer.kind=byte_bpe", f"tokenizer.vocab_size={a.vocab}"
    )
    out, export = wd / "runs" / "base", wd / "export-base"
    train("base", 0, data, out, a)
    if not (export / "config.json").exists():
        from training.checkpoint.run_dir import RunDir

        cli("export", "--checkpoint", RunDir(out).step_dir(a.base_steps), "--out", export, log=wd / "export.log")
    val = figures(out, a.base_steps)["bpb"]
    print(f"base model, its own validation split: mean bpb {statistics.fmean(val.values()):.4f}", flush=True)
    return export


def run_arms(wd: Path, a: argparse.Namespace, export: Path) -> dict[str, Any]:
    """The three arms with every seed and the base model, evaluated on the test text prepared
    with each tokenizer; per arm, a list (one per seed) of per-language figures."""
    held = wd / "corpus" / "held"
    data = {"base-tok": prepare(held, wd / "data-held", f"tokenizer.model={export}")}
    data["extended"] = prepare(
        held, wd / "data-held-ext", f"tokenizer.model={export}", f"tokenizer.extend_with={a.extend}"
    )
    data["scratch"] = data["base-tok"]
    test = {
        k: prepare(
            wd / "corpus" / "test",
            wd / f"test-{k}",
            f"tokenizer.model={tokenizer_of(data[k])}",
            "pack.valid_fraction=0.9",
        )
        for k in ("base-tok", "extended")
    }
    test["scratch"] = test["base-tok"]
    init = f"train.init_from={export}"
    results: dict[str, Any] = {arm: [] for arm in ARMS}
    for seed in range(1, a.seeds + 1):
        for arm in ARMS:
            out = wd / "runs" / f"{arm}-seed{seed}"
            train(arm, seed, data[arm], out, a, *([init] if arm != "scratch" else []), test=test[arm])
            results[arm].append(figures(out / "test", a.steps))
    from training.checkpoint.run_dir import RunDir

    first = wd / "runs" / "base-tok-seed1"
    evaluate(RunDir(first).step_dir(0), data["base-tok"], test["base-tok"], first / "test-step0", a.items)
    results["base model"] = [figures(first / "test-step0", 0)]
    results["tokenizers"] = {k: str(tokenizer_of(data[k])) for k in ("base-tok", "extended")}
    return results


def mean_sd(values: list[float], fmt: str = ".4f") -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):{fmt}} ± {sd:{fmt}}"


def summarise(results: dict[str, Any], held: list[str], base: list[str]) -> dict[str, dict[str, list[float]]]:
    """Per arm (and the base model), per seed: the mean over held-back and over base languages
    of bpb and accuracy, and the base languages' bpb change from the base model."""
    ref = statistics.fmean(results["base model"][0]["bpb"][x] for x in base)
    out = {}
    for arm in ("base model", *ARMS):
        s: dict[str, list[float]] = {}
        for r in results[arm]:
            for name, langs in (("held", held), ("base", base)):
                for k in ("bpb", "acc"):
                    s.setdefault(f"{name}_{k}", []).append(
                        statistics.fmean(r[k][x] for x in langs if r[k].get(x) is not None)
                    )
            s.setdefault("forgetting", []).append(s["base_bpb"][-1] - ref)
        out[arm] = s
    return out


def report_arms(results: dict[str, Any], tpb: dict[str, dict[str, float]], held: list[str], base: list[str], a) -> dict:
    """The arms' tables (module docstring); returns the summary."""
    s = summarise(results, held, base)
    tok_of = {"base model": "base-tok", "base-tok": "base-tok", "extended": "extended", "scratch": "base-tok"}
    budget = f"{a.steps} steps × {a.tokens_per_step:,} tokens"
    print(f"\n### Adapting to {', '.join(held)}: {budget}, mean ± sd over {a.seeds} seeds\n")
    cols = ["held-back bpb", "held-back acc", "base bpb", "forgetting (Δ base bpb)", "base acc"]
    cols += ["tokens/byte held", "tokens/byte base"]
    print("| arm | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for arm, f in s.items():
        t = tpb[tok_of[arm]]
        cells = [mean_sd(f["held_bpb"]), mean_sd(f["held_acc"], ".3f"), mean_sd(f["base_bpb"])]
        cells += [f"{mean_sd(f['forgetting'])}", mean_sd(f["base_acc"], ".3f")]
        cells += [f"{statistics.fmean(t[x] for x in held):.4f}", f"{statistics.fmean(t[x] for x in base):.4f}"]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    print("\nbpb per language (mean ± sd over seeds; the base model: one evaluation)\n")
    print("| lang | group | role | " + " | ".join(s) + " | tokens/byte base-tok | extended |")
    print("|---|---|---|" + "---|" * (len(s) + 2))
    for lang in held + base:
        cells = [mean_sd([r["bpb"][lang] for r in results[arm]]) for arm in s]
        cells += [f"{tpb[k][lang]:.4f}" for k in ("base-tok", "extended")]
        role = "held-back" if lang in held else "base"
        print(f"| {lang} | {languages.get(lang).group} | {role} | " + " | ".join(cells) + " |")
    print("\naccuracy: continuation (chance 0.25); items are cut in tokens: compare it between arms of one tokenizer")
    return s


def time_encode(tokenizer: Path, texts: list[str], repeats: int = 3) -> float:
    """Best of ``repeats`` MB/s of ``encode_batch`` over ``texts`` in batches of 512, in this process."""
    from bloomline.tokenizer import open_tokenizer

    tok, nbytes, best = open_tokenizer(tokenizer), sum(len(t.encode()) for t in texts), float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(0, len(texts), 512):
            tok.encode_batch(texts[i : i + 512])
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e6


def write_sample(corpus: Path, out: Path) -> Path:
    """Every line of ``corpus``'s texts, as prepare's sample writes them (data_prep/passes/tokenizer.py):
    the demo recipe's ``sample_bytes`` (20 MB) exceeds the base corpus, so its sample is all of it (prepare
    deletes its own with its work folder)."""
    from data_prep.passes.tokenizer import sample_lines

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for docs in texts_of(corpus, sorted(p.stem for p in corpus.glob("*.jsonl"))).values():
            f.writelines(line + "\n" for d in docs for line in sample_lines(d))
    return out


def compare_libraries(wd: Path, a: argparse.Namespace, texts: dict[str, list[str]]) -> dict[str, Any]:
    """tokenizers against SentencePiece on the base corpus's text (module docstring)."""
    from data_prep.passes import byte_bpe
    from data_prep.passes import tokenizer as sp_pass

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core, as SentencePiece's num_threads=1 (set before any use)
    folder, got = wd / "libraries", {}
    sample = [write_sample(wd / "corpus" / "base", folder / "sample.txt")]
    t0 = time.perf_counter()
    bpe = byte_bpe.train_byte_bpe(sample, folder / "tokenizers", a.vocab)
    got["tokenizers"] = {"train_s": time.perf_counter() - t0, "file": bpe}
    (folder / "sentencepiece").mkdir(exist_ok=True)
    t0 = time.perf_counter()
    spm = sp_pass.train(sample, folder / "sentencepiece" / "tokenizer", a.vocab, 0.9995, 1, 1234)
    got["sentencepiece"] = {"train_s": time.perf_counter() - t0, "file": spm}
    every = [t for docs in texts.values() for t in docs]
    for lib in got.values():
        lib["encode_mb_s"] = time_encode(lib["file"], every)
        lib["tokens_per_byte"] = tokens_per_byte(lib["file"], texts)
        lib["file"] = str(lib["file"])
    got["sample_bytes"] = sum(f.stat().st_size for f in sample)
    return got


def report_libraries(got: dict[str, Any], a: argparse.Namespace) -> None:
    """The library comparison's table, and where tokenizers loses."""
    tk, sp = got["tokenizers"], got["sentencepiece"]
    print(f"\n### tokenizers (byte-level BPE) vs SentencePiece (BPE, byte fallback): vocab {a.vocab:,}, ")
    print(f"the same {got['sample_bytes'] / 1e6:.2f} MB sample; one core; tokens per byte on held-out-source text\n")
    print("| | tokenizers | SentencePiece | ratio |\n|---|---|---|---|")
    print(f"| training (s) | {tk['train_s']:.2f} | {sp['train_s']:.2f} | {tk['train_s'] / sp['train_s']:.2f} |")
    x, y = tk["encode_mb_s"], sp["encode_mb_s"]
    print(f"| encode (MB/s, 1 core) | {x:.2f} | {y:.2f} | {x / y:.2f} |")
    worse = []
    for lang, x in tk["tokens_per_byte"].items():
        y = sp["tokens_per_byte"][lang]
        print(f"| tokens/byte {lang} | {x:.4f} | {y:.4f} | {x / y:.3f} |")
        if x > y:
            worse.append(f"{lang} (+{x / y - 1:.1%})")
    losses = ["training time"] if tk["train_s"] > sp["train_s"] else []
    losses += ["encode speed"] if tk["encode_mb_s"] < sp["encode_mb_s"] else []
    losses += [f"tokens per byte in {', '.join(worse)}"] if worse else []
    print(f"\ntokenizers loses on: {'; '.join(losses) if losses else 'nothing measured here'}")


def options() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--smoke", action="store_true", help="a few minutes: " + ", ".join(f"{k}={v}" for k, v in SMOKE.items())
    )
    ap.add_argument("--workdir", type=Path, help="(/tmp/bloomline-adapt, --smoke: /tmp/bloomline-adapt-smoke)")
    ap.add_argument("--held", help=f"held-back languages ({HELD})")
    ap.add_argument("--base", help=f"base languages ({BASE})")
    ap.add_argument("--vocab", type=int, help="base tokenizer's vocabulary (8000)")
    ap.add_argument("--extend", type=int, help="tokens the extended arm adds (1000)")
    ap.add_argument("--base-steps", type=int, help="steps of the base model (400)")
    ap.add_argument("--steps", type=int, help="steps of every arm (100)")
    ap.add_argument("--seeds", type=int, help="seeds of every arm (3)")
    ap.add_argument("--tokens-per-step", type=int, default=4096)
    ap.add_argument("--test-kb", type=float, help="test text per language, KB (48)")
    ap.add_argument("--items", type=int, help="continuation items per language (50)")
    a = ap.parse_args()
    for k, v in (SMOKE if a.smoke else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.workdir = a.workdir or Path("/tmp/bloomline-adapt" + ("-smoke" if a.smoke else ""))
    return a


def main() -> None:
    a = options()
    held, base = a.held.split(","), a.base.split(",")
    wd = a.workdir
    wd.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    where = split_corpus(wd, held, base, a.test_kb)
    print("| lang | role | training sources | test source (KB) |\n|---|---|---|---|")
    for lang, w in where.items():
        role = "held-back" if lang in held else "base"
        print(f"| {lang} | {role} | {', '.join(w['train'])} | {w['test']} ({w['test_bytes'] / 1024:.0f}) |")
    export = run_base(wd, a)
    results = run_arms(wd, a, export)
    texts = texts_of(wd / "corpus" / "test", held + base)
    tpb = {k: tokens_per_byte(Path(p), texts) for k, p in results["tokenizers"].items()}
    summary = report_arms(results, tpb, held, base, a)
    libraries = compare_libraries(wd, a, texts)
    report_libraries(libraries, a)
    report = {"args": {k: str(v) for k, v in vars(a).items()}, "sources": where, "results": results}
    report.update(summary=summary, tokens_per_byte=tpb, libraries=libraries, wall_s=time.time() - t0)
    (wd / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"\nall figures: {wd / 'report.json'}; wall {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
