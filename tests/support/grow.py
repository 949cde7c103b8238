"""Grow a corpus of unique, realistic documents from ../shared/corpus, for benchmarks at scale
(``python -m bench.grow OUT_DIR --mb 256`` grows one by hand).

Plain copies of a corpus would all be deduplicated, so each language gets a token-level Markov
chain (order 2) trained on its own documents of ../shared/corpus, and every new document is a
walk through it whose length is drawn from the language's real document lengths. A token is a
run of non-space characters with the whitespace after it, so code keeps its indentation and
line breaks; Chinese, written without spaces, is walked character by character. The walks keep
each language's words, scripts and punctuation, and are unique documents: they share phrases,
as real documents of one language do, not whole texts.

Duplicates are then put back on purpose, as a real crawl has them: ``dup_rate`` of the
documents are copies of an earlier document of the same language, half exact (other id, other
case) and half near (about 3% of the tokens changed). Every language keeps its share of the
source corpus's bytes. Output: ``OUT_DIR/<lang>.jsonl`` (fields id, text, lang, source), the
same for the same arguments; a finished folder (``OUT_DIR/.grown.json``, hidden so that
readers of the folder skip it) is reused.
"""

from __future__ import annotations

import json
import random
import re
from multiprocessing import Pool
from pathlib import Path

from tests.support import REPO

SHARED = REPO.parent / "shared" / "corpus"
ORDER = 2
TOKEN = re.compile(r"\S+\s*|\s+")


def tokens(text: str, by_char: bool) -> list[str]:
    return list(text) if by_char else TOKEN.findall(text)


def train(texts: list[str], by_char: bool) -> tuple[dict, list, list[int]]:
    """Successors of each ORDER-token state, the documents' first states, and their lengths."""
    chain: dict[tuple, list[str]] = {}
    starts, lengths = [], []
    for t in texts:
        toks = tokens(t, by_char)
        if len(toks) <= ORDER:
            continue
        starts.append(tuple(toks[:ORDER]))
        lengths.append(len(toks))
        for i in range(len(toks) - ORDER):
            chain.setdefault(tuple(toks[i : i + ORDER]), []).append(toks[i + ORDER])
    return chain, starts, lengths


def walk(chain: dict, starts: list, lengths: list[int], rng: random.Random) -> str:
    n = rng.choice(lengths)
    state = rng.choice(starts)
    out = list(state)
    while len(out) < n:
        nxt = chain.get(state)
        if not nxt:  # a document's end: go on from another document's start
            state = rng.choice(starts)
            out.extend(state)
            continue
        tok = rng.choice(nxt)
        out.append(tok)
        state = (*state[1:], tok)
    return "".join(out).strip()


def near_copy(text: str, rng: random.Random, by_char: bool) -> str:
    toks = tokens(text, by_char)
    for _ in range(max(1, len(toks) // 33)):
        i = rng.randrange(len(toks))
        toks[i] = toks[rng.randrange(len(toks))]
    return "".join(toks)


def grow_language(job: tuple[Path, Path, int, float, int]) -> tuple[str, int, int]:
    src, out, target, dup_rate, seed = job
    recs = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    lang = recs[0]["lang"]
    by_char = lang.startswith("zh")
    chain, starts, lengths = train([r["text"] for r in recs], by_char)
    rng = random.Random(f"{seed}:{lang}")
    written = docs = 0
    made: list[str] = []
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            r = rng.random()
            if made and r < dup_rate / 2:
                text, kind = rng.choice(made).upper(), "exact"
            elif made and r < dup_rate:
                text, kind = near_copy(rng.choice(made), rng, by_char), "near"
            else:
                text, kind = walk(chain, starts, lengths, rng), "walk"
                if len(made) < 4096:  # copies are drawn from the first walks (bounded memory)
                    made.append(text)
            line = (
                json.dumps(
                    {"id": f"{lang}-g{seed}-{docs:08d}", "text": text, "lang": lang, "source": f"markov:{kind}"},
                    ensure_ascii=False,
                )
                + "\n"
            )
            f.write(line)
            written += len(line.encode("utf-8"))
            docs += 1
    tmp.replace(out)
    return lang, docs, written


def grow(
    out: Path,
    mb: float,
    dup_rate: float = 0.04,
    seed: int = 0,
    workers: int = 2,
    targets: dict[str, int] | None = None,
) -> dict:
    """Write the grown corpus into ``out`` (reused when already complete); returns its summary.
    ``targets``: bytes per source file (by its stem: ``en``, ``tum``, ``python``) instead of
    ``mb`` spread as the source's own shares (tests/support/skewed.py: ROOTS' proportions)."""
    done = out / ".grown.json"
    want = {"mb": mb, "dup_rate": dup_rate, "seed": seed, **({"targets": targets} if targets else {})}
    if done.exists() and json.loads(done.read_text())["args"] == want:
        return json.loads(done.read_text())
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(SHARED.rglob("*.jsonl"))
    total = sum(f.stat().st_size for f in files)
    size = (lambda f: targets[f.stem]) if targets else (lambda f: int(mb * 1e6 * f.stat().st_size / total))
    jobs = [(f, out / f"{f.parent.name}-{f.stem}.jsonl", size(f), dup_rate, seed) for f in files]
    jobs.sort(key=lambda j: -j[2])  # largest first: the pool ends when its last job does
    with Pool(workers) as pool:
        res = pool.map(grow_language, jobs, chunksize=1)
    summary = {
        "args": want,
        "documents": sum(d for _, d, _ in res),
        "bytes": sum(b for _, _, b in res),
        "languages": {lang: {"documents": d, "bytes": b} for lang, d, b in sorted(res)},
    }
    done.write_text(json.dumps(summary, indent=1) + "\n")
    return summary
