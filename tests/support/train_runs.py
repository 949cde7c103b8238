"""Multi-process training runs of bloom-tiny on CPU, launched as ``bloomline train`` launches its
ranks (DeepSpeed's launcher, gloo): :func:`launch` writes the recipe (``BASE`` and the caller's
overrides) into the run folder and runs the ranks to the end, :func:`ok` asserts they succeeded,
:func:`metrics` reads the run's metrics log. For the tests that need real ranks: the trainer's
(tests/training/loop/test_trainer_multiproc.py), the online mixture's, the import from Hugging
Face and the parallel evaluator's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from bloomline.config import load_config, to_dict
from tests.support import REPO
from training.config import TrainRecipe
from training.loop.launch import launch_command
from training.parallel.shm import release_job_shm

BASE = ["train.steps=4", "checkpoint.interval=2", "optim.decay_steps=30"]


def command(data: Path, out: Path, overrides: list[str]) -> list[str]:
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", [*BASE, *overrides])
    out.mkdir(parents=True, exist_ok=True)
    recipe = out / "recipe.json"
    recipe.write_text(json.dumps(to_dict(r)))
    return launch_command(recipe, str(data), str(out), r.parallel.world_size)


ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}


def launch(data: Path, out: Path, overrides: list[str], **env: str) -> subprocess.CompletedProcess:
    """The ranks of one run; ``env``: switches of training/config/drills.py."""
    cmd = command(data, out, overrides)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env={**ENV, **env})
    finally:
        release_job_shm(cmd)


def ok(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


def metrics(out: Path) -> list[dict]:
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
