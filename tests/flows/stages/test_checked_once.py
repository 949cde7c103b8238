"""Each input is checked once, where it enters (docs/design.md): a flow handed what its caller
checked (flows/run/params.py ``InProcess.checked``) runs on it instead of checking again; a caller
that hands nothing gets the flow's own check."""

import json
import sys
from pathlib import Path

import pytest

from bloomline.config import load_config, to_dict
from bloomline.errors import BloomlineError
from flows.run.params import flow_args
from flows.stages.train import entered
from flows.stages.train_job import check, fit_model_to_data
from training.config import TrainRecipe

REPO = Path(__file__).resolve().parents[3]


def test_the_train_flow_runs_on_the_recipe_its_caller_checked(demo_data, tmp_path):
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    checked = check(r, demo_data)
    params, local = flow_args(to_dict(r), checked=checked)
    gone = str(tmp_path / "no-data")  # checking the recipe again would read it, and fail
    assert entered(params, gone, local) is checked
    with pytest.raises(BloomlineError, match="no-data"):
        entered(params, gone, None)  # a caller that checked nothing: the flow checks
    with pytest.raises(ValueError, match="other parameters"):
        entered({**params, "seed": 7}, gone, local)  # what was checked must be what is run


@pytest.fixture
def reads():
    """Opens of a bloomline.json while :data:`counting` holds a folder (an audit hook cannot be
    removed, so it counts only then)."""
    seen: list[str] = []
    counting: list[Path] = []

    def hook(event, args):
        if counting and event == "open" and isinstance(args[0], (str, Path)):
            p = str(args[0])
            if p.endswith("bloomline.json") and p.startswith(str(counting[0])):
                seen.append(p)

    sys.addaudithook(hook)
    yield seen, counting
    counting.clear()


def test_an_evaluation_reads_the_checkpoint_record_once_where_it_entered(demo_data, tmp_path, reads):
    from data_prep.storage.shards import manifest_sha256
    from eval.evaluate import checked
    from flows.stages.evaluate import evaluate_flow
    from tests.support.checkpoints import write_checkpoint
    from training.config import EvalConfig
    from training.model.bloom import Bloom

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.zero_stage=0"])  # weights only
    fit_model_to_data(r, demo_data)
    ckpt = tmp_path / "run" / "checkpoints" / "step_4"
    meta = write_checkpoint(ckpt, r, Bloom(r.model, seed=1))
    (ckpt / "bloomline.json").write_text(json.dumps({**meta, "data_manifest_sha256": manifest_sha256(demo_data)}))
    cfg = load_config(
        EvalConfig, REPO / "configs/eval/default.yaml", ["max_tokens_per_lang=50", "tasks=[]", "prompts_per_lang=0"]
    )
    seen, counting = reads
    counting.append(ckpt)
    record = checked(ckpt, demo_data, cfg)  # the CLI's check: the one read
    assert len(seen) == 1
    params, local = flow_args(to_dict(cfg), checked=record)
    assert evaluate_flow(str(ckpt), str(demo_data), params, local=local)["step"] == 4
    assert len(seen) == 1, seen
    params, local = flow_args(to_dict(cfg))
    evaluate_flow(str(ckpt), str(demo_data), params, local=local)  # nothing handed: the flow reads it
    assert len(seen) == 2, seen
