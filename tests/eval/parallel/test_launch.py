"""Starting and ending a parallel evaluation (eval/parallel/launch.py): an evaluation that runs past
its timeout is stopped, every rank killed, and fails in one line; the ranks' error lines reach
the user."""

import json
import time
from pathlib import Path

import psutil
import pytest
import torch

from bloomline.config import from_dict, load_config
from bloomline.io import sha256_file
from training.checkpoint.meta import make_meta
from training.config import EvalConfig, TrainRecipe
from training.model.bloom import Bloom

REPO = Path(__file__).resolve().parents[3]


def checkpoint(demo: Path, folder: Path) -> Path:
    """A 1-rank checkpoint of an untrained bloom-tiny, as DeepSpeed writes it at ZeRO 0."""
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.zero_stage=0"])
    step = folder / "run" / "checkpoints" / "step_1"
    step.mkdir(parents=True)
    torch.save({"module": Bloom(r.model, seed=3).state_dict()}, step / "mp_rank_00_model_states.pt")
    sampler = {"version": 2, "seed": 1, "step": 1, "consumed_tokens": 0, "tokens_by_lang": {}, "streams": {}}
    counters = {"skipped": 0, "fp16_overflows": 0, "skipped_in_a_row": 0, "loss_ema": None}
    meta = make_meta(1, r, demo, sha256_file(demo / "manifest.json"), sampler, counters)
    (step / "bloomline.json").write_text(json.dumps(meta))
    return step


def ranks_of_this_test() -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_an_evaluation_past_its_timeout_is_stopped_in_one_line_with_no_rank_left(demo_data, tmp_path):
    from eval.evaluate import evaluate
    from eval.parallel.launch import EvaluationFailed

    step = checkpoint(demo_data, tmp_path)
    cfg = from_dict(EvalConfig, {"parallel": {"pp": 2, "timeout_s": 1}, "prompts_per_lang": 0})
    t0 = time.monotonic()
    with pytest.raises(EvaluationFailed) as e:
        evaluate(step, demo_data, cfg, "run")
    assert time.monotonic() - t0 < 30
    assert "\n" not in str(e.value) and "ran past parallel.timeout_s=1 s and was stopped" in str(e.value)
    assert not ranks_of_this_test()


def test_a_ranks_refusal_reaches_the_user_as_its_own_line(demo_data, tmp_path):
    """A checkpoint file cut short is met by the ranks, not by the process that starts them: the
    error line a rank prints is what the evaluation fails with."""
    from eval.evaluate import evaluate
    from eval.parallel.launch import EvaluationFailed

    step = checkpoint(demo_data, tmp_path)
    f = step / "mp_rank_00_model_states.pt"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(EvaluationFailed) as e:
        evaluate(step, demo_data, from_dict(EvalConfig, {"parallel": {"pp": 2}}), "run")
    assert "\n" not in str(e.value) and str(e.value).startswith(str(f)), e.value
    assert not ranks_of_this_test()
