"""Resuming a run: which checkpoint, in which form, loading it, and the RNG states saved with it.

A checkpoint of the run's own layout is loaded as DeepSpeed wrote it; one of another TP/PP/DP/ZeRO
layout from its ``step_N/universal`` form, which ``bloomline train`` writes before starting the
ranks (training/checkpoint/reshard.py). The RNG states go into DeepSpeed's model-state files, which the
data-parallel rank 0 of each (pp, tp) position writes; other DP ranks restore those (the model
has no dropout, so no rank's results depend on its RNG today).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from bloomline.errors import BloomlineError, CheckpointError
from training.checkpoint.integrity import damage
from training.checkpoint.meta import read_meta, trained_on
from training.checkpoint.reshard import has_universal, reshard_command
from training.checkpoint.run_dir import RunDir, step_dir_name
from training.checkpoint.safe_load import enforced
from training.config import ParallelConfig
from training.parallel.layout import layout_label, layout_of


def plan_resume(run: RunDir, data_dir: Path, parallel: ParallelConfig) -> tuple[Optional[int], bool]:
    """(step to resume from or None, whether to load its universal form); refuses a checkpoint
    trained on other data, or of another layout not converted yet."""
    step = run.latest_step()
    if step is None:
        return None, False
    step_dir = run.step_dir(step)
    meta = read_meta(step_dir)
    if not trained_on(meta, data_dir):
        raise BloomlineError(
            f"{step_dir} was trained on other data (manifest hash differs): use a new run folder or the same --data"
        )
    saved, now = meta["layout"], layout_of(parallel)
    if saved == now:
        return step, False
    if not has_universal(step_dir, now):
        raise BloomlineError(
            f"{step_dir} was written with {layout_label(saved)}; this run has {layout_label(now)}. `bloomline train` converts it "
            f"before resuming; by hand: python -m training.checkpoint.reshard "
            + " ".join(reshard_command(step_dir, now)[3:])
        )
    return step, True


def load_engine(engine: Any, run: RunDir, step: int, meta: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Load checkpoint ``step`` of ``run`` (``meta``: its bloomline.json) into the DeepSpeed
    ``engine``, optimizer states included, LR scheduler's not; in its universal form where the
    engine was configured to load that (:func:`plan_resume`). Returns the client state saved with
    it (None if none). CheckpointError if a file was damaged since the driver checked it
    (training/checkpoint/integrity.py): that fails the same way on every restart, a user error
    (exit 2). Anything else (a peer that died, a collective's timeout, memory) is raised as it
    came, a crash, which a restart may get past."""
    step_dir = run.step_dir(step)
    try:
        with enforced():  # DeepSpeed's loader asks for weights_only=False (training/checkpoint/safe_load.py)
            if engine.load_universal_checkpoint():
                # ranks of this layout each cut their slice of the whole tensors in step_N/universal
                _, client = engine.load_checkpoint(
                    str(step_dir), tag="universal", load_optimizer_states=True, load_lr_scheduler_states=False
                )
            else:
                _, client = engine.load_checkpoint(
                    str(run.checkpoints),
                    tag=step_dir_name(step),
                    load_optimizer_states=True,
                    load_lr_scheduler_states=False,
                )
    except Exception as e:
        if isinstance(e, CheckpointError):
            raise
        problem = damage(step_dir, meta)
        if problem is not None:
            raise CheckpointError(f"{step_dir} could not be loaded: {problem}") from None
        raise
    return client


def rng_state() -> dict[str, Any]:
    """This rank's RNG states, saved with its checkpoint files."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        # this rank's device only: a resume may see another number of GPUs
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }


def restore_rng(rng: Optional[dict[str, Any]]) -> None:
    if not rng:
        return
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if isinstance(rng.get("cuda"), torch.Tensor) and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
