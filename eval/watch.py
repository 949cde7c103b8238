"""Automatic evaluation while ``bloomline train`` runs: a watcher process beside the ranks.

The train flow starts it (``python -m eval.watch``) in its own session at a lower priority
(``evaluation.nice``, one torch thread unless ``evaluation.settings.threads`` says otherwise), so
neither a slow nor a hung evaluation can stall training: BLOOM-176B evaluated inside its training
loop, and one hung evaluation stopped the run for about 18 hours. The watcher evaluates every
complete checkpoint exactly once, each as its own Prefect flow run (``evaluate``):

* newest first, when checkpoints come faster than evaluations finish (the latest state is what a
  user watches), the older ones after it — none silently skipped;
* a checkpoint that ``checkpoint.keep`` would delete waits for its evaluation (the trainer keeps
  it while this watcher is alive, see ``training.checkpoint.RunDir.prune``); when more than
  ``evaluation.max_deferred`` wait, the oldest is recorded as skipped with the reason
  (``RUN_DIR/eval/skipped.jsonl``), as is a checkpoint whose evaluation failed;
* when the flow marks training done, it drains what is left and exits; the flow waits for it up
  to ``evaluation.drain_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from bloomline.config import from_dict, to_dict
from eval.results import record_skipped, settled
from training.checkpoint import RunDir
from training.config import TrainRecipe

PID_FILE = Path("eval") / "watcher.pid"
DONE_FILE = Path("eval") / "training_done"


def watcher_alive(run_dir: str | Path) -> bool:
    """Whether a watcher process is running for this run (so pending checkpoints will be evaluated)."""
    try:
        pid = int((Path(run_dir) / PID_FILE).read_text())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def pending(run_dir: str | Path) -> list[int]:
    """Complete checkpoints neither evaluated nor recorded as skipped, newest first."""
    done = settled(run_dir)
    return sorted((s for s in RunDir(run_dir).complete_steps() if s not in done), reverse=True)


def prune_options(run_dir: str | Path, recipe: TrainRecipe) -> dict:
    """``RunDir.prune`` options that keep checkpoints waiting for this run's evaluation."""
    return {"waiting": lambda s: s not in settled(run_dir), "max_deferred": recipe.evaluation.max_deferred,
            "on_skip": lambda s, why: record_skipped(run_dir, s, why)}


def watch(run_dir: Path, data: Path, recipe: TrainRecipe, done: Callable[[], bool], poll_s: float = 1.0,
          evaluate: Callable[..., dict] | None = None) -> list[int]:
    """Evaluate checkpoints as they appear until ``done()`` and none is pending; the steps evaluated."""
    if evaluate is None:
        from flows.evaluate import evaluate_flow as evaluate
    folder = RunDir(run_dir)
    settings = to_dict(recipe.evaluation.settings)
    evaluated = []
    while True:
        todo = pending(run_dir)
        if not todo:
            if done():
                return evaluated
            time.sleep(poll_s)
            continue
        step = todo[0]
        t0 = time.perf_counter()
        try:
            evaluate(str(folder.step_dir(step)), str(data), settings, str(run_dir))
            evaluated.append(step)
            print(f"evaluated step {step} in {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:  # a deleted, damaged or refused checkpoint: say so, go on with the others
            traceback.print_exc()
            record_skipped(run_dir, step, f"its evaluation failed: {type(e).__name__}: {e}")
        folder.prune(recipe.checkpoint.keep, **prune_options(run_dir, recipe))  # what waited for this evaluation


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Evaluate a training run's checkpoints as they appear.")
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--recipe", required=True, type=Path, help="the run's resolved recipe (recipe.json)")
    args = ap.parse_args(argv)
    recipe = from_dict(TrainRecipe, json.loads(args.recipe.read_text()))
    recipe.resolve_paths(Path("."))
    os.nice(recipe.evaluation.nice)
    if recipe.evaluation.idle_priority and hasattr(os, "SCHED_IDLE"):
        # Linux's idle class: the CPU only when nothing else wants it. A nice level alone still takes
        # a share of a core, and a training op waits for its slowest thread.
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    import torch

    torch.set_num_threads(recipe.evaluation.settings.threads or 1)
    pid = args.run / PID_FILE
    pid.parent.mkdir(parents=True, exist_ok=True)
    pid.write_text(str(os.getpid()))
    try:
        watch(args.run, args.data, recipe, done=lambda: (args.run / DONE_FILE).exists())
    finally:
        pid.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
