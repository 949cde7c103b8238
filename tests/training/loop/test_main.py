"""A rank switches TorchDynamo off only where nothing of its run is compiled (training/loop/main.py)."""

from pathlib import Path

import torch

from bloomline.config import load_config
from training.config import TrainRecipe
from training.loop.main import nothing_compiles

REPO = Path(__file__).resolve().parents[3]


def test_torchdynamo_is_switched_off_only_where_nothing_compiles():
    def recipe(*o):
        return load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", list(o))

    assert nothing_compiles(recipe("model.attention=sdpa"))
    assert not nothing_compiles(recipe("train.compile=true"))  # the blocks are compiled
    assert not nothing_compiles(recipe("model.attention=flex"))  # FlexAttention is compiled
    # auto measures FlexAttention against sdpa on a GPU, and picks sdpa without one
    assert nothing_compiles(recipe("model.attention=auto")) == (not torch.cuda.is_available())
