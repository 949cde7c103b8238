"""Which checkpoint a run resumes from, and in which form (training/checkpoint/resume.py plan_resume); the RNG
states saved with it."""

import random
from pathlib import Path

import pytest
import torch

from bloomline.config import load_config
from bloomline.errors import BloomlineError
from bloomline.io import write_json_atomic
from data_prep.storage.shards import manifest_sha256
from training.checkpoint.meta import SAMPLER_KEYS, TRAINER_KEYS, make_meta
from training.checkpoint.reshard import MARKER
from training.checkpoint.resume import plan_resume, restore_rng, rng_state
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe
from training.parallel.layout import layout_of

REPO = Path(__file__).resolve().parents[3]


def data(tmp_path, name="data", text='{"shards": []}'):
    d = tmp_path / name
    d.mkdir()
    (d / "manifest.json").write_text(text)
    return d


def checkpoint(run: RunDir, recipe: TrainRecipe, data_dir, step: int) -> None:
    d = run.step_dir(step)
    d.mkdir(parents=True)
    meta = make_meta(
        step,
        recipe,
        data_dir,
        manifest_sha256(data_dir),
        dict.fromkeys(SAMPLER_KEYS, 0),
        dict.fromkeys(TRAINER_KEYS, 0),
    )
    write_json_atomic(d / "bloomline.json", meta)
    run.latest_file.write_text(d.name)


def test_the_latest_checkpoint_of_the_same_data_and_layout(tmp_path):
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    run, d = RunDir(tmp_path / "run"), data(tmp_path)
    assert plan_resume(run, d, recipe.parallel) == (None, False)  # a new run
    checkpoint(run, recipe, d, 10)
    checkpoint(run, recipe, d, 20)
    assert plan_resume(run, d, recipe.parallel) == (20, False)
    # other data: refused, whatever the folder's name
    with pytest.raises(BloomlineError, match="trained on other data"):
        plan_resume(run, data(tmp_path, "other", '{"shards": [1]}'), recipe.parallel)


def test_another_layout_needs_its_universal_form(tmp_path):
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    run, d = RunDir(tmp_path / "run"), data(tmp_path)
    checkpoint(run, recipe, d, 10)
    wider = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.dp=2"])
    with pytest.raises(BloomlineError, match="python -m training.checkpoint.reshard"):
        plan_resume(run, d, wider.parallel)
    universal = run.step_dir(10) / "universal"
    universal.mkdir()
    write_json_atomic(universal / MARKER, {"layout": layout_of(wider.parallel)})
    assert plan_resume(run, d, wider.parallel) == (10, True)


def test_rng_states_restored():
    state = rng_state()
    a = (random.random(), torch.rand(3).tolist())
    restore_rng(state)
    assert (random.random(), torch.rand(3).tolist()) == a
