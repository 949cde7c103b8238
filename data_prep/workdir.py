"""The folder of a ``bloomline prepare`` run: where each stage's files and completion markers live.

``DIR/manifest.json``, ``DIR/tokenizer/``, ``DIR/shards/`` are the output (contract 1,
``data_prep/FORMAT.md``); ``DIR/.work/`` holds the stages' intermediate files and markers
(``data_prep/pipeline.py``), removed when the run completes unless ``keep_work``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from bloomline.io import remove_stale_tmp


@dataclass
class Paths:
    """Paths of one prepare run's folder."""

    out: Path

    @property
    def work(self) -> Path:
        return self.out / ".work"

    def chunk_data(self, cid: int) -> Path:
        return self.work / "chunks" / f"c{cid:06d}.arrow"

    def chunk_done(self, cid: int) -> Path:
        return self.work / "chunks" / f"c{cid:06d}.json"

    def chunk_drops(self, cid: int) -> Path:
        return self.work / "dedup" / f"c{cid:06d}.json"

    def part_done(self, lang: str, k: int) -> Path:
        return self.work / "parts" / f"{lang}-p{k:05d}.json"

    @property
    def manifest(self) -> Path:
        return self.out / "manifest.json"

    @property
    def tokenizer(self) -> Path:
        return self.out / "tokenizer" / "tokenizer.model"


def shard_path(split: str, lang: str, bucket: int, k: int) -> str:
    """A shard's path relative to DIR (one split, language, bucket and pack part)."""
    return f"shards/{split}/{lang}/{lang}-b{bucket:05d}-p{k:05d}.arrow"


def prepare_start(paths: Paths) -> None:
    """Before any stage: the folder exists and no temporary file of a killed run is left."""
    paths.out.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(paths.out)


def clean_work(paths: Paths) -> None:
    shutil.rmtree(paths.work, ignore_errors=True)
