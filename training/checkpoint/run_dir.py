"""The run folder's layout (``bloomline train --out``): :class:`RunDir` names every file and folder
a run holds, for the trainer, the evaluation and the dashboard alike (training/CHECKPOINT.md);
``checkpoints/step_N/`` and ``latest``, moved when a checkpoint is published. What is kept of
the checkpoints is training/checkpoint/retention.py's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bloomline.errors import CheckpointError
from bloomline.io import write_bytes_atomic, write_json_atomic
from training.checkpoint.retention import Retention

META_FILE = "bloomline.json"
"""A checkpoint's metadata file (training/checkpoint/meta.py), written last: its presence marks the
checkpoint complete."""
_TAG = re.compile(r"^step_(\d+)$")

# ------------------------------------------------------------------------------------ the folder


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def step_of_dir_name(tag: str, where: Path | str = "") -> int:
    """N of ``step_N``; CheckpointError naming ``where`` for anything else."""
    m = _TAG.match(tag)
    if not m:
        raise CheckpointError(f"{where}: '{tag}' is not a checkpoint name (step_N)")
    return int(m.group(1))


@dataclass
class RunDir(Retention):
    """A training run's folder (``bloomline train --out``)."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest_file(self) -> Path:
        return self.checkpoints / "latest"

    metrics = property(lambda self: self.root / "metrics.jsonl")
    recipe = property(lambda self: self.root / "recipe.json")
    stop = property(lambda self: self.root / "STOP")  # touch it: save a checkpoint and exit cleanly
    tensorboard = property(lambda self: self.root / "tensorboard")
    logs = property(lambda self: self.root / "logs")
    data_stamp = property(lambda self: self.root / "data_verified.json")  # training/data/shard_reader.py: verify_once
    # what evaluation writes into the run (eval/RESULTS.md) and the dashboard reads
    eval = property(lambda self: self.root / "eval")
    results = property(lambda self: self.eval / "results")
    generations = property(lambda self: self.eval / "generations")
    skipped = property(lambda self: self.eval / "skipped.jsonl")
    eval_stamp = property(lambda self: self.eval / "data_verified.json")  # the validation shards' checksums
    training_done = property(lambda self: self.eval / "training_done")  # the watcher drains, then exits
    # the evaluation key (flows/stages/pipeline.py) the results in eval/ were made with; absent: unknown
    evaluated_with = property(lambda self: self.eval / "evaluated_with.json")
    dashboard = property(lambda self: self.root / "dashboard")
    # the online mixture (training/data/mixture/controller.py): its changes, write-ahead; the evaluations it may
    # read (written by eval/publish.py, one file per evaluated checkpoint); the reference run's curve
    mixture_log = property(lambda self: self.root / "mixture.jsonl")
    mixture_feedback = property(lambda self: self.root / "mixture" / "feedback")
    mixture_reference = property(lambda self: self.root / "mixture" / "reference.json")

    @classmethod
    def of_checkpoint(cls, step_dir: str | Path) -> "RunDir":
        """The run a checkpoint folder (``RUN_DIR/checkpoints/step_N``) belongs to."""
        return cls(Path(step_dir).resolve().parent.parent)

    def step_dir(self, step: int) -> Path:
        return self.checkpoints / step_dir_name(step)

    def latest_step(self) -> Optional[int]:
        """The step ``latest`` points to (None before the first checkpoint)."""
        if not self.latest_file.is_file():
            return None
        step = step_of_dir_name(self.latest_file.read_text().strip(), self.latest_file)
        if not (self.step_dir(step) / META_FILE).is_file():
            raise CheckpointError(f"{self.latest_file} points to {step_dir_name(step)}, which has no {META_FILE}")
        return step

    def latest_dir(self) -> Optional[Path]:
        step = self.latest_step()
        return None if step is None else self.step_dir(step)

    def complete_steps(self) -> list[int]:
        """Steps whose folder holds a bloomline.json (written last), ascending."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(
            int(m.group(1))
            for p in self.checkpoints.iterdir()
            if (m := _TAG.match(p.name)) and (p / META_FILE).is_file()
        )

    def step_number(self, name: str) -> Optional[int]:
        """N of a folder named ``step_N`` in checkpoints/, None for any other name."""
        m = _TAG.match(name)
        return int(m.group(1)) if m else None

    def publish(self, step: int, meta: dict[str, Any], keep: int) -> None:
        """After every rank has written its files: write bloomline.json, move ``latest`` to the
        step (atomically), then :meth:`prune` up to it."""
        write_json_atomic(self.step_dir(step) / META_FILE, meta)
        write_bytes_atomic(self.latest_file, step_dir_name(step).encode())
        self.prune(keep, step)
