"""Decontamination: drop every corpus document that shares a normalised n-gram with an item of
the evaluation tasks the run will be judged on (the data recipe's ``decontaminate``).

The idea is GPT-3's (Brown et al. 2020, app. C) and lm-eval's 13-gram overlap report, and
datatrove's ``decont/n_grams.py`` does it for a pipeline; here the tasks are the very entries the
evaluation runs (``bloomline.task_spec.TaskSpec``: ``name``, ``data`` = ``DATA/<lang>.jsonl``,
``langs``, ``limit``), so the dashboard never reports items the model read in training.

* An item's text: its string fields, in the record's order, joined by spaces (for the tasks of
  eval/tasks/ that is the story and its endings, the premise and choices, the passage and its
  question and answers, ...); a record that is not a JSON object is an error naming file:line.
* Normalised as in :func:`normalize`: NFC, lower case, every punctuation and symbol character
  (Unicode categories P* and S*) a space, runs of whitespace one space.
* Spaced languages: word n-grams (``ngram`` words, 13 by default). Languages written without
  spaces (scripts Hans, Hant, Jpan, Thai, Mymr, Khmr, Laoo, Tibt: BLOOM's Chinese here) use
  character n-grams of ``char_ngram`` characters (20 by default: about 13 words of Chinese at
  1.5 characters a word), whitespace removed. A document is checked against the items of its
  own kind of language (a Chinese document against Chinese items, any spaced one against all
  spaced items).
* An item shorter than one n-gram cannot be found and is not indexed; the manifest counts them.
* The index: each n-gram as a 64-bit hash (words by CRC-32, combined by a polynomial over the
  window, then splitmix64), sorted, with the item it came from; 12 bytes per n-gram. Built once
  per run by the planner from the task files (:func:`build_index`), saved under the work folder
  and loaded once by each worker process (:func:`load_index`), so nothing large crosses the scheduler.
* Costs (bench/eval_tasks.py, this 2-core machine, one process): the index takes 11.7 MiB and
  2.3 s to build per million n-grams; checking a corpus costs 1.2 s per million n-grams of its
  documents (the step was 17% of the chunks pass on ../shared/corpus against 182,461 n-grams of
  2,202 items: 962 against 1,091 documents/s).
* A match is booked as stage ``decontaminate``, outcome ``filtered``, reason ``contaminated``;
  the drop log's ``duplicate_of`` names the item (``task/lang.jsonl:line``), ``score`` counts the
  document's n-grams that are in the index. A 64-bit collision could drop a clean document with
  probability about (document n-grams × index n-grams) / 2⁶⁴: none in practice.
"""

from __future__ import annotations

import json
import sys
import unicodedata
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from bloomline import languages
from bloomline.errors import DataError
from bloomline.io import atomic_path, sha256_file, write_bytes_atomic
from bloomline.task_spec import task_records
from data_prep.steps.document import Document, Ledger
from data_prep.steps.minhash import mix64
from data_prep.steps.step import PipelineStep
from data_prep.steps.text import UNSPACED_SCRIPTS

_P = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the window polynomial (the golden ratio's bits)
_TABLE: Optional[dict[int, str]] = None


def unspaced(lang: str) -> bool:
    """Whether ``lang`` (a bloomline code) is written without spaces between words."""
    code = languages.resolve(lang)
    return code is not None and languages.get(code).script in UNSPACED_SCRIPTS


def _punct_table() -> dict[int, str]:
    global _TABLE
    if _TABLE is None:  # every P* and S* code point → space (built once per process, ~0.4 s)
        _TABLE = {c: " " for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c))[0] in "PS"}
    return _TABLE


def normalize(text: str) -> str:
    """NFC, lower case, punctuation and symbols as spaces, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFC", text).lower().translate(_punct_table()).split())


def _windows(h: np.ndarray, n: int) -> np.ndarray:
    """The hash of every window of ``n`` consecutive unit hashes."""
    if len(h) < n:
        return np.zeros(0, np.uint64)
    m = len(h) - n + 1
    out = np.zeros(m, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):  # Σ h[i+k]·P^(n-1-k) mod 2^64, vectorised over i
            out = out * _P + h[k : k + m]
    return mix64(out)


def grams(norm: str, lang: str, cfg: Any) -> np.ndarray:
    """The n-gram hashes of normalised text in ``lang`` (words, or characters where unspaced)."""
    if unspaced(lang):
        s = norm.replace(" ", "")
        return _windows(np.frombuffer(s.encode("utf-32-le"), np.uint32).astype(np.uint64), cfg.char_ngram)
    words = norm.split(" ") if norm else []
    return _windows(np.fromiter((zlib.crc32(w.encode()) for w in words), np.uint64, len(words)), cfg.ngram)


def task_files(tasks: list[Any]) -> list[tuple[str, str, Path]]:
    """(task, language, file) of every task entry's ``DATA/<lang>.jsonl`` (narrowed by ``langs``), sorted."""
    out = []
    for t in tasks:
        folder = Path(t.data)
        if not folder.is_dir():
            raise DataError(f"decontaminate: task '{t.name}' data folder {folder} does not exist")
        for f in sorted(folder.glob("*.jsonl")):
            lang = f.name[: -len(".jsonl")]
            if t.langs is None or lang in t.langs:
                out.append((t.name, lang, f))
    return out


def items(task: str, lang: str, path: Path, limit: Optional[int]) -> Iterator[tuple[str, str]]:
    """(name ``task/lang.jsonl:line``, text) of a task file's items (module docstring)."""
    for k, (no, rec) in enumerate(task_records(path)):
        if limit is not None and k >= limit:
            return
        yield f"{task}/{path.name}:{no}", " ".join(v for v in rec.values() if isinstance(v, str))


@dataclass
class Index:
    """Sorted n-gram hashes and, for each, the item it came from; words and characters apart."""

    words: np.ndarray
    words_item: np.ndarray
    chars: np.ndarray
    chars_item: np.ndarray
    items: list[str]

    def match(self, g: np.ndarray, unspaced_: bool) -> tuple[int, Optional[str]]:
        """(how many of ``g`` are in the index, the item of the first of them in ``g``'s order)."""
        keys, owner = (self.chars, self.chars_item) if unspaced_ else (self.words, self.words_item)
        if not len(g) or not len(keys):
            return 0, None
        pos = np.searchsorted(keys, g).clip(0, len(keys) - 1)
        hit = keys[pos] == g
        if not hit.any():
            return 0, None
        return int(hit.sum()), self.items[int(owner[pos[np.argmax(hit)]])]


def build_index(cfg: Any, out: Path) -> dict[str, Any]:
    """Index every item of ``cfg.tasks`` into ``out`` (``index.npz``, ``items.json``); what the
    manifest records: each task file's sha256, items, n-grams, and items too short to index."""
    cols: dict[bool, tuple[list[np.ndarray], list[np.ndarray]]] = {False: ([], []), True: ([], [])}
    names: list[str] = []
    files = []
    for task, lang, path in task_files(cfg.tasks):
        limit = next((t.limit for t in cfg.tasks if t.name == task), None)
        n_items = short = n_grams = 0
        for name, text in items(task, lang, path, limit):
            g = np.unique(grams(normalize(text), lang, cfg))
            n_items += 1
            if not len(g):
                short += 1
                continue
            cols[unspaced(lang)][0].append(g)
            cols[unspaced(lang)][1].append(np.full(len(g), len(names), np.int32))
            names.append(name)
            n_grams += len(g)
        files.append(
            {
                "task": task,
                "lang": lang,
                "file": path.name,
                "sha256": sha256_file(path),
                "items": n_items,
                "ngrams": n_grams,
                "too_short": short,
            }
        )
    arrays = {}
    for kind, is_unspaced in (("words", False), ("chars", True)):
        g, owner = cols[is_unspaced]
        keys = np.concatenate(g) if g else np.zeros(0, np.uint64)
        own = np.concatenate(owner) if owner else np.zeros(0, np.int32)
        order = np.lexsort((own, keys))  # by hash, then the first item: the same index whatever the order
        keys, own = keys[order], own[order]
        first = np.concatenate([[True], keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, bool)
        arrays[kind], arrays[kind + "_item"] = keys[first], own[first]
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "index.npz", durable=False) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)  # a file object: np.savez would add ".npz" to the temporary name
    write_bytes_atomic(out / "items.json", json.dumps(names, ensure_ascii=False).encode(), durable=False)
    return {
        "ngram": cfg.ngram,
        "char_ngram": cfg.char_ngram,
        "files": files,
        "ngrams": int(len(arrays["words"]) + len(arrays["chars"])),
    }


_LOADED: dict[str, Index] = {}


def load_index(folder: Path) -> Index:
    """The index :func:`build_index` wrote, loaded once per process."""
    key = str(folder)
    if key not in _LOADED:
        z = np.load(folder / "index.npz")
        _LOADED.clear()  # one run's index at a time
        _LOADED[key] = Index(
            z["words"],
            z["words_item"],
            z["chars"],
            z["chars_item"],
            json.loads((folder / "items.json").read_text(encoding="utf-8")),
        )
    return _LOADED[key]


class Decontaminator(PipelineStep):
    """Drops a document that shares an n-gram with a task item (module docstring)."""

    name = "decontaminate"

    def __init__(self, cfg: Any, index: Index, ledger: Ledger):
        super().__init__(ledger)
        self.cfg, self.index = cfg, index

    def process(self, doc: Document) -> Document | None:
        lang_unspaced = unspaced(doc.lang)
        g = grams(normalize(doc.text), doc.lang, self.cfg)
        self.stats["ngrams_checked"] += len(g)
        hits, item = self.index.match(g, lang_unspaced)
        if hits:
            self.drop(doc, "filtered", "contaminated", score=float(hits), threshold=1.0, duplicate_of=item)
            return None
        return doc
