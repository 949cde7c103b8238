"""Where the evaluation beside training runs (eval/beside.py): the node's GPUs no rank takes, the
CPU when every GPU holds a rank, or the GPUs the recipe lists; as the watcher's
CUDA_VISIBLE_DEVICES, through the parent's own; and what ``bloomline plan`` says of it."""

import json

import pytest
from typer.testing import CliRunner

from bloomline.errors import ConfigError
from eval.beside import evaluator_gpus, visible_devices
from tests.support.hf_bloom import REPO


def test_the_evaluator_takes_the_gpus_no_rank_takes_else_the_cpu_unless_listed():
    assert evaluator_gpus(None, 8, 4) == [4, 5, 6, 7]
    assert evaluator_gpus(None, 8, 8) == [] and evaluator_gpus(None, 4, 16) == []  # the CPU
    assert evaluator_gpus([0], 8, 8) == [0]  # shared, as the recipe says
    with pytest.raises(ConfigError, match=r"'evaluation.gpus': \[8\]: this node has GPUs 0 to 7"):
        evaluator_gpus([8], 8, 4)
    assert visible_devices([2, 3], None) == "2,3" and visible_devices([], None) == ""
    assert visible_devices([1], "4,5,6") == "5"  # the index among the GPUs the parent sees


def test_plan_says_where_the_evaluation_beside_training_runs():
    from flows.cli.app import app

    def beside(*over: str) -> dict:
        args = ["plan", "--config", str(REPO / "configs/train/bloom-560m.yaml"), "--gpu", "a100-80gb", "--json"]
        res = CliRunner().invoke(app, [*args, *[x for o in over for x in ("-o", o)]])
        return json.loads(res.stdout)["evaluation"]["beside_training"]

    assert beside()["gpus"] == [1, 2, 3, 4, 5, 6, 7]
    full = beside("parallel.dp=8")
    assert full["gpus"] == [] and full["where"].startswith("the CPU")
    assert beside("parallel.dp=8", "evaluation.gpus=[7]")["gpus"] == [7]
