"""The evaluation watcher's queue (eval/watch.py) and the checkpoints that wait for it."""

import json

from eval.results import evaluated_steps, record_skipped, skipped_steps, write_results
from eval.watch import pending, watch
from training.checkpoint import RunDir


def complete(run: RunDir, *steps: int) -> None:
    for s in steps:
        run.step_dir(s).mkdir(parents=True, exist_ok=True)
        (run.step_dir(s) / "bloomline.json").write_text("{}")
    run.latest_file.write_text(f"step_{max(steps)}")


def test_newest_first_none_skipped_silently(tmp_path):
    from bloomline.config import load_config
    from pathlib import Path

    from training.config import TrainRecipe

    recipe = load_config(TrainRecipe, Path(__file__).resolve().parents[2] / "configs/train/bloom-tiny.yaml",
                         ["checkpoint.keep=1"])
    run = RunDir(tmp_path)
    complete(run, 10, 20, 30, 40)
    record_skipped(tmp_path, 40, "tested")
    assert pending(tmp_path) == [30, 20, 10]  # newest first; recorded ones are settled
    order = []

    def evaluate(ckpt, data, settings, out):
        step = int(ckpt.rsplit("_", 1)[1])
        order.append(step)
        if step == 20:
            raise RuntimeError("the checkpoint is damaged")
        write_results(out, step, [], [])

    assert watch(tmp_path, tmp_path, recipe, done=lambda: True, evaluate=evaluate) == [30, 10]
    assert order == [30, 20, 10] and evaluated_steps(tmp_path) == [10, 30]
    assert skipped_steps(tmp_path) == {20: "its evaluation failed: RuntimeError: the checkpoint is damaged", 40: "tested"}
    assert run.complete_steps() == [40]  # keep=1: the rest were deleted once settled


def test_checkpoints_wait_for_their_evaluation_up_to_max_deferred(tmp_path):
    run = RunDir(tmp_path)
    complete(run, 1, 2, 3, 4, 5)
    skipped = {}
    deleted = run.prune(keep=1, waiting=lambda s: s in (2, 3, 4), max_deferred=2,
                        on_skip=lambda s, why: skipped.update({s: why}))
    assert deleted == [1, 2] and run.complete_steps() == [3, 4, 5]  # 1 was evaluated; 2 waited longest
    assert list(skipped) == [2] and "evaluation.max_deferred=2" in skipped[2]
    assert run.prune(keep=1) == [3, 4] and run.complete_steps() == [5]
    assert json.loads(json.dumps(skipped))
