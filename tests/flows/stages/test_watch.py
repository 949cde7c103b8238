"""The evaluation watcher's queue (flows/stages/watch.py) and the checkpoints that wait for it (RunDir.hold)."""

import logging
import subprocess
import sys
import time
from pathlib import Path

from eval.results.table import evaluated_steps, record_skipped, skipped_steps, write_results
from flows.stages.train import stop_watcher
from flows.stages.watch import pending, watch
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe

REPO = Path(__file__).resolve().parents[3]


def complete(run: RunDir, *steps: int) -> None:
    for s in steps:
        run.step_dir(s).mkdir(parents=True, exist_ok=True)
        (run.step_dir(s) / "bloomline.json").write_text("{}")
    run.latest_file.write_text(f"step_{max(steps)}")


def test_newest_first_none_skipped_silently(tmp_path):
    from pathlib import Path

    from bloomline.config import load_config
    from training.config import TrainRecipe

    recipe = load_config(
        TrainRecipe, Path(__file__).resolve().parents[3] / "configs/train/bloom-tiny.yaml", ["checkpoint.keep=1"]
    )
    run = RunDir(tmp_path)
    complete(run, 10, 20, 30, 40)
    record_skipped(tmp_path, 40, "tested")
    assert pending(tmp_path) == [30, 20, 10]  # newest first; recorded ones are settled
    order = []

    def evaluate(ckpt, data, settings, out, local=None):
        step = int(ckpt.rsplit("_", 1)[1])
        order.append(step)
        if step == 20:  # an error quoting a secret: what the watcher records of it is masked
            raise RuntimeError("the checkpoint is damaged (s3://u:w4tch-s3cr3t@h/k)")
        write_results(out, step, [], [])

    assert watch(tmp_path, tmp_path, recipe, done=lambda: True, evaluate=evaluate) == [30, 10]
    assert order == [30, 20, 10] and evaluated_steps(tmp_path) == [10, 30]
    assert skipped_steps(tmp_path) == {
        20: "its evaluation failed: RuntimeError: the checkpoint is damaged (s3://u:***@h/k)",
        40: "tested",
    }
    assert b"w4tch-s3cr3t" not in run.skipped.read_bytes()
    assert run.complete_steps() == [40]  # keep=1: the rest were deleted once settled


def test_what_is_left_when_training_ends_is_evaluated_after_the_drain_hook(tmp_path):
    """The watcher calls on_drain once, as soon as it finds training done, before the checkpoints
    left over are evaluated (main gives them every core there)."""
    from bloomline.config import load_config

    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    run = RunDir(tmp_path)
    complete(run, 10)
    events, ends = [], iter([False, True])

    def evaluate(ckpt, data, settings, out, local=None):
        step = int(ckpt.rsplit("_", 1)[1])
        events.append(step)
        if step == 10:
            complete(run, 10, 20, 30)  # two more saved while step 10 was evaluated; then training ends
        write_results(out, step, [], [])

    done = lambda: next(ends, True)  # noqa: E731
    assert watch(tmp_path, tmp_path, recipe, done=done, evaluate=evaluate, on_drain=lambda: events.append("drain"))
    assert events == [10, "drain", 30, 20]


def test_checkpoints_wait_for_their_evaluation_up_to_max_deferred(tmp_path):
    """The watcher's hold keeps the checkpoints it has not released, up to max_deferred; prune logs
    the ones it deletes anyway, and the watcher records them as skipped with that reason."""
    import os
    import subprocess
    import sys

    from flows.stages.watch import record_pruned

    run = RunDir(tmp_path)
    complete(run, 1, 2, 3, 4, 5)
    run.hold(os.getpid(), released=[1, 5], max_deferred=2)
    deleted = run.prune(keep=1)
    assert deleted == [1, 2] and run.complete_steps() == [3, 4, 5]  # 1 was released; 2 waited longest
    assert [r["step"] for r in run.pruned()] == [2] and "evaluation.max_deferred=2" in run.pruned()[0]["reason"]
    assert record_pruned(tmp_path) >= {2} and skipped_steps(tmp_path)[2] == run.pruned()[0]["reason"]
    # a hold whose process is gone (a SIGKILLed watcher) holds nothing
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run.hold(int(dead.stdout), released=[], max_deferred=2)
    assert run.holder() is None and run.prune(keep=1) == [3, 4] and run.complete_steps() == [5]
    assert [r["step"] for r in run.pruned()] == [2]  # deleting without a hold is not logged


def test_the_checkpoint_being_evaluated_is_never_deleted(tmp_path):
    """The watcher evaluates newest first; the oldest waiting checkpoint, the one prune would give
    up first, may be the one it is reading: busy keeps it."""
    import os

    run = RunDir(tmp_path)
    complete(run, 1, 2, 3, 4, 5)
    run.hold(os.getpid(), released=[], max_deferred=1, busy=2)
    assert run.prune(keep=1) == [1, 3]  # 4 waits (max_deferred=1), 2 is busy, 5 is the newest
    assert run.complete_steps() == [2, 4, 5] and [r["step"] for r in run.pruned()] == [1, 3]


def test_a_watcher_killed_at_the_end_of_the_drain_leaves_no_hold(tmp_path):
    """A watcher still busy when evaluation.drain_s runs out is SIGKILLed and cannot remove its
    own hold: stopping it does, and records what it left as skipped."""
    run = RunDir(tmp_path)
    complete(run, 1, 2)
    hang = (
        f"import os, time; from training.checkpoint.run_dir import RunDir; "
        f"RunDir({str(tmp_path)!r}).hold(os.getpid(), [], 4); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", hang], cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 60
    while not run.hold_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.holder() is not None
    out = stop_watcher(proc, tmp_path, TrainRecipe(), logging.getLogger("test"), drain_s=0.1)
    assert proc.returncode == -9  # it was killed, not drained
    assert not run.hold_file.exists()
    assert set(out["skipped"]) == {1, 2} and "drain_s" in out["skipped"][2]


def test_the_watcher_never_deletes_a_checkpoint_being_saved(tmp_path):
    """A folder above ``latest`` without bloomline.json is a save in progress to the watcher (the
    ranks write it while it evaluates): only the run's writer deletes such folders. The watcher's
    prune once took a finishing save's files from under the ranks, leaving a step_30 that held
    bloomline.json alone."""
    from bloomline.config import load_config

    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["checkpoint.keep=1"])
    run = RunDir(tmp_path)
    complete(run, 10, 20)
    saving = run.step_dir(30)
    saving.mkdir()
    (saving / "mp_rank_00_model_states.pt").write_bytes(b"being written")

    def evaluate(ckpt, data, settings, out, local=None):
        write_results(out, int(ckpt.rsplit("_", 1)[1]), [], [])

    assert watch(tmp_path, tmp_path, recipe, done=lambda: True, evaluate=evaluate) == [20, 10]
    assert (saving / "mp_rank_00_model_states.pt").read_bytes() == b"being written"
    assert run.complete_steps() == [20]  # what the watcher may delete, it did
    assert run.prune(keep=1) == [30] and not saving.exists()  # the writer's prune: a killed save's leftovers go
