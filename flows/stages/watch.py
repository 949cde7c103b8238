"""Automatic evaluation while ``bloomline train`` runs: a watcher process beside the ranks.

The train flow starts it (``python -m flows.stages.watch``) in its own session at a lower priority
(``evaluation.nice``, one torch thread unless ``evaluation.settings.threads`` says otherwise, every
core the process may use once training is over) and,
while training runs, held to ``evaluation.cpu_share`` of a core (flows/run/pace.py), so neither a
slow, a hung nor a busy evaluation can stall training: BLOOM-176B evaluated inside its training
loop, and one hung evaluation stopped the run for about 18 hours. The watcher evaluates every
complete checkpoint exactly once, each as its own Prefect flow run (``evaluate``):

* newest first, when checkpoints come faster than evaluations finish (the latest state is what a
  user watches), the older ones after it — none silently skipped;
* a checkpoint that ``checkpoint.keep`` would delete waits for its evaluation: the watcher holds
  the ones it has not settled (``RunDir.hold``, ``checkpoints/hold.json``), and the trainer's
  prune keeps them while it lives; when more than ``evaluation.max_deferred`` wait, prune deletes
  the oldest and logs why (``checkpoints/pruned.jsonl``), which the watcher records as skipped
  (``RUN_DIR/eval/skipped.jsonl``), as it does a checkpoint whose evaluation failed;
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
from eval.results.table import record_skipped, settled
from flows.run.pace import Pacer, install
from flows.run.params import flow_args
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe


def pending(run_dir: str | Path) -> list[int]:
    """Complete checkpoints neither evaluated nor recorded as skipped, newest first."""
    done = settled(run_dir)
    return sorted((s for s in RunDir(run_dir).complete_steps() if s not in done), reverse=True)


def record_pruned(run_dir: str | Path) -> set[int]:
    """Record each checkpoint prune deleted before its evaluation as skipped, with prune's reason;
    returns the settled steps."""
    done = settled(run_dir)
    for r in RunDir(run_dir).pruned():
        if r["step"] not in done:
            record_skipped(run_dir, r["step"], r["reason"])
            done.add(r["step"])
    return done


def settle(run_dir: str | Path, max_deferred: int, busy: int | None = None) -> None:
    """:func:`record_pruned`, then hold every checkpoint still unsettled (for this process's life),
    and ``busy``, the one being evaluated, whatever happens."""
    RunDir(run_dir).hold(os.getpid(), record_pruned(run_dir), max_deferred, busy)


def watch(
    run_dir: Path,
    data: str | Path,
    recipe: TrainRecipe,
    done: Callable[[], bool],
    poll_s: float = 1.0,
    evaluate: Callable[..., dict] | None = None,
    pacer: Pacer | None = None,
    on_drain: Callable[[], None] = lambda: None,
) -> list[int]:
    """Evaluate checkpoints as they appear until ``done()`` and none is pending; the steps evaluated.
    ``pacer`` (installed on the process's forwards) is also settled after each evaluation;
    ``on_drain`` is called once, when training is found done (what is left has the machine to itself)."""
    folder = RunDir(run_dir)
    settings = to_dict(recipe.evaluation.settings)
    evaluated: list[int] = []
    draining = False
    while True:
        settle(run_dir, recipe.evaluation.max_deferred)
        todo = pending(run_dir)
        if not draining and done():
            draining = True
            on_drain()
        if not todo:
            if draining:
                return evaluated
            time.sleep(poll_s)
            continue
        step = todo[0]
        settle(run_dir, recipe.evaluation.max_deferred, busy=step)
        if evaluate is None:  # imported once a checkpoint waits, so the watcher announces itself first (hold.json)
            from flows.stages.evaluate import evaluate_flow as evaluate
        t0 = time.perf_counter()
        try:
            sent, local = flow_args(settings)
            evaluate(str(folder.step_dir(step)), str(data), sent, str(run_dir), local=local)
            evaluated.append(step)
            if pacer is not None:
                pacer.pace()  # the CPU spent outside forwards (loading, writing, the dashboard)
            print(
                f"evaluated step {step} in {time.perf_counter() - t0:.1f} s"
                + (f" (paced: {pacer.slept:.1f} s slept so far)" if pacer is not None else ""),
                flush=True,
            )
        except Exception as e:  # a deleted, damaged or refused checkpoint: say so, go on with the others
            traceback.print_exc()
            record_skipped(run_dir, step, f"its evaluation failed: {type(e).__name__}: {e}")
        settle(run_dir, recipe.evaluation.max_deferred)  # releases this checkpoint
        folder.prune(recipe.checkpoint.keep, writer=False)  # what waited for this evaluation


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Evaluate a training run's checkpoints as they appear.")
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--data", required=True)  # a path or a URL
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

    threads = recipe.evaluation.settings.threads
    torch.set_num_threads(threads or 1)
    done = RunDir(args.run).training_done.exists

    drained = False

    def drain() -> None:
        nonlocal drained
        # the ranks have exited: what is left to evaluate may use every core this process may run
        # on (the demo's three checkpoints left at the end: 44 s on one thread of two cores), the
        # evaluation under way too (the pacer calls this in its thread; the demo's first
        # checkpoint, begun during training, then took 13 s more at half the machine)
        if threads is None and not drained:
            drained = True
            torch.set_num_threads(len(os.sched_getaffinity(0)))
            print(f"training is done: evaluating on {torch.get_num_threads()} threads", flush=True)

    pacer = None
    if recipe.evaluation.cpu_share is not None:
        pacer = Pacer(recipe.evaluation.cpu_share, active=lambda: not done(), on_end=drain)
        install(pacer)
    try:
        watch(args.run, args.data, recipe, done=done, pacer=pacer, on_drain=drain)
    finally:
        RunDir(args.run).hold_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
