"""The folder of a ``bloomline prepare`` run: where each pass's files and completion markers live.

``DIR/manifest.json``, ``DIR/tokenizer/``, ``DIR/shards/`` are the output (contract 1,
``data_prep/FORMAT.md``); ``DIR/.work/`` holds the passes' intermediate files and markers
(``data_prep/pipeline.py``), removed when the run completes unless ``keep_work``.

The folder may be a URL (``s3://bucket/run``): each process then works in its own local copy
(bloomline/mirror.py), and every accessor here that names a file another process may have
written returns it as the store has it (fetched once per process, absent where the store lacks
it). Code that reads a file of the folder reads it through an accessor of :class:`Paths`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bloomline.io import remove_stale_tmp
from bloomline.mirror import Mirror
from bloomline.storage import is_url, local_path


@dataclass
class Paths:
    """Paths of one prepare run's folder."""

    out: Path
    """The folder, or this process's local copy of it when it is at a URL."""
    store: Optional[Mirror] = None
    """The copy's link to the store, for a folder at a URL."""

    @classmethod
    def at(cls, where: str | Path) -> "Paths":
        """The folder at ``where``: a local path, or a URL (through this process's copy of it)."""
        if is_url(str(where)):
            m = Mirror.of(str(where))
            return cls(m.local, m)
        return cls(local_path(where).resolve())

    @property
    def where(self) -> str:
        """The folder's own name: its URL, or its local path (what messages name, what tasks get)."""
        return self.store.url if self.store else str(self.out)

    def get(self, path: Path) -> Path:
        """``path`` (a file of the folder) as the folder holds it: for a folder at a URL, the
        store's copy, or nothing where the store has none."""
        return self.store.fetch(path) if self.store else path

    def tree(self, folder: Path) -> Path:
        """Every file under ``folder`` (a subfolder) as the folder holds it."""
        return self.store.fetch_tree(folder) if self.store else folder

    @property
    def work(self) -> Path:
        return self.out / ".work"

    def work_file(self, name: str) -> Path:
        """A pass's record and marker under ``.work`` (``plan.json``, ``dedup.json``, ``tokenizer.json``)."""
        return self.get(self.work / name)

    @property
    def decontaminate(self) -> Path:
        """The decontamination index (data_prep/steps/decontaminate.py), built by the planner."""
        return self.tree(self.work / "decontaminate")

    def chunk_data(self, cid: int) -> Path:
        return self.get(self.work / "chunks" / f"c{cid:06d}.arrow")

    def chunk_done(self, cid: int) -> Path:
        return self.get(self.work / "chunks" / f"c{cid:06d}.json")

    def chunk_drops(self, cid: int) -> Path:
        """The dedup decision of chunk ``cid`` (its dropped positions and kept-document stats); its marker."""
        return self.get(self.work / "dedup" / f"c{cid:06d}.json")

    def tok_sample(self, cid: int, suffix: str = ".txt") -> Path:
        """Chunk ``cid``'s part of the tokenizer's training sample (``.txt``), and its marker (``.json``)."""
        return self.get(self.work / "tok" / f"sample-c{cid:06d}{suffix}")

    # -- the dedup job's intermediate files (data_prep/dedup/): Arrow IPC files whose record batch
    #    i holds the rows routed to partition i, each closed by a JSON marker of the same name
    @property
    def dedup_plan(self) -> Path:
        return self.get(self.work / "dedup" / "plan.json")

    def dedup_file(self, kind: str, i: int) -> Path:
        """The file of task ``i`` of one step: ``exact-keys``, ``band-keys`` (per chunk);
        ``exact``, ``exact-facts``, ``exact-later``, ``pairs``, ``facts`` (per key partition);
        ``labels`` (per node partition)."""
        return self.work / "dedup" / kind / f"{i:06d}.arrow"  # read through shuffle.py, which fetches

    def part_done(self, lang: str, k: int) -> Path:
        return self.get(self.work / "parts" / f"{lang}-p{k:05d}.json")

    def dedup_star(self, step: int, q: int) -> Path:
        """Output of component step ``step`` (odd: Large-Star, even: Small-Star) for partition ``q``."""
        return self.work / "dedup" / "stars" / f"s{step:03d}-q{q:05d}.arrow"  # as dedup_file

    @property
    def manifest(self) -> Path:
        from data_prep.storage.shards import manifest_path

        return self.get(manifest_path(self.out))

    @property
    def tokenizer(self) -> Path:
        """The run's tokenizer file: ``tokenizer/tokenizer.json`` (byte-level BPE) where the
        tokenizer pass wrote one, else ``tokenizer/tokenizer.model`` (SentencePiece)."""
        hf = self.tree(self.out / "tokenizer") / "tokenizer.json"
        return hf if hf.exists() else self.out / "tokenizer" / "tokenizer.model"


def shard_path(split: str, lang: str, bucket: int, k: int) -> str:
    """A shard's path relative to DIR (one split, language, bucket and pack part)."""
    return f"shards/{split}/{lang}/{lang}-b{bucket:05d}-p{k:05d}.arrow"


def prepare_start(paths: Paths) -> None:
    """Before any pass: the folder exists and no temporary file of a killed run is left, in DIR
    or in the subfolders a prepare run writes (data_prep/FORMAT.md, "Files"), nowhere else: DIR
    may be a folder of the user's (``--out ~``)."""
    from data_prep.storage.droplog import DROPPED_DIR, SCORES_DIR

    paths.out.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(paths.out, (paths.work.name, "tokenizer", "shards", DROPPED_DIR, SCORES_DIR))


def clean_work(paths: Paths) -> None:
    if paths.store:
        paths.store.remove(paths.work)
    shutil.rmtree(paths.work, ignore_errors=True)


def clean_dedup(paths: Paths) -> None:
    """Forget the dedup pass and what follows it (its files, the drop log's duplicates, the later
    markers); the chunks pass's work stays. For timing the dedup pass again on the same chunks."""
    shutil.rmtree(paths.work / "dedup", ignore_errors=True)
    for p in [paths.work / "dedup.json", paths.manifest, *paths.out.glob("dropped/dedup-c*.parquet")]:
        p.unlink(missing_ok=True)
