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
    from flows.train import open_run

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
