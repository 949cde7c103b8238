"""A run's checkpoints on the loopback S3 server (training/checkpoint/mirror.py), in process: the
mirror keeps the newest ``keep``, an empty run folder pulls its latest (the train flow's
``open_run`` does), and a checkpoint URL is read through a copy refreshed when the mirror's changes."""

import json
import logging

import torch

from bloomline.config import load_config
from bloomline.io import write_bytes_atomic
from tests.support import REPO
from tests.support.checkpoints import one_rank_checkpoint
from training.checkpoint.mirror import fetch_checkpoint, mirrored_steps, upload_checkpoint
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe


def saved(run: RunDir, step: int, value: float, demo_data) -> None:
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    one_rank_checkpoint(run.step_dir(step), {"w": torch.full((4,), value)}, recipe, demo_data)
    meta = json.loads((run.step_dir(step) / "bloomline.json").read_text())
    (run.step_dir(step) / "bloomline.json").write_text(json.dumps({**meta, "step": step}))
    write_bytes_atomic(run.latest_file, f"step_{step}".encode())


def test_the_mirror_keeps_the_newest_and_an_empty_run_folder_resumes_from_it(s3, demo_data, tmp_path):
    from flows.stages.train import open_run

    url = f"s3://{s3.bucket}/mirrors/{tmp_path.name}"
    run = RunDir(tmp_path / "run")
    for step in (1, 2, 3):
        saved(run, step, float(step), demo_data)
        upload_checkpoint(run, step, url, keep=2)
    assert mirrored_steps(url) == [2, 3]
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", [f"checkpoint.mirror={url}"])
    fresh = open_run(recipe, tmp_path / "fresh", None, logging.getLogger("test"))
    assert fresh.latest_step() == 3
    for p in run.step_dir(3).iterdir():
        assert (fresh.step_dir(3) / p.name).read_bytes() == p.read_bytes()


def test_a_checkpoint_url_is_fetched_again_when_the_mirror_holds_another(s3, demo_data, tmp_path):
    url = f"s3://{s3.bucket}/mirrors/{tmp_path.name}"
    for value in (1.0, 2.0):  # the same run saved again into the same mirror
        run = RunDir(tmp_path / f"run-{value}")
        saved(run, 1, value, demo_data)
        upload_checkpoint(run, 1, url, keep=2)
        got = fetch_checkpoint(f"{url}/checkpoints/step_1", tmp_path / "cache")
        assert torch.load(got / "mp_rank_00_model_states.pt")["module"]["w"][0] == value


def test_latest_is_never_pruned_and_a_copied_runs_future_goes(s3, demo_data, tmp_path):
    """A mirror holding step 100 of a copied run: this run's step 60, published with keep=1, stays
    with its latest; the other's step 100 goes (the local rule for steps past latest)."""
    from training.checkpoint.mirror import prunable

    url = f"s3://{s3.bucket}/mirrors/{tmp_path.name}"
    other, mine = RunDir(tmp_path / "copy"), RunDir(tmp_path / "run")
    saved(other, 100, 1.0, demo_data)
    upload_checkpoint(other, 100, url, keep=1)
    saved(mine, 60, 2.0, demo_data)
    upload_checkpoint(mine, 60, url, keep=1)
    fs = s3.fs()
    assert fs.cat_file(f"{url}/checkpoints/latest") == b"step_60" and mirrored_steps(url) == [60]
    assert prunable([10, 20, 30, 40], 30, 2) == [10, 40] and prunable([30], 30, 1) == []


def test_a_second_run_on_a_mirror_in_use_is_refused(s3, tmp_path):
    import pytest

    from flows.run.runlock import FolderInUse
    from flows.stages.train import owned_mirror
    from tests.support.holder import start_holder

    url = f"s3://{s3.bucket}/mirrors/{tmp_path.name}"
    holder = start_holder(url, "flow train (checkpoint.mirror)")  # another run's train flow holds it
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", [f"checkpoint.mirror={url}"])
    try:
        with pytest.raises(FolderInUse, match=rf"^{url} is in use by pid {holder.pid} on .*flow train \(checkpoint"):
            with owned_mirror(recipe, print):
                pass
    finally:
        holder.kill()
        holder.wait()
