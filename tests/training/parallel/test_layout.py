"""Names and tensor-parallel cuts of Bloom's parameters at every layout (training/parallel/layout.py)."""

import re

import pytest
import torch

from training.config import ModelConfig
from training.model.bloom import Bloom
from training.parallel.layout import bloom_name, first_mismatch, layout_name, pipeline_name, tp_dim, tp_merge, tp_slice

CFG = ModelConfig(vocab_size=1000, hidden_size=64, num_layers=4, num_heads=4, seq_len=64, init_std=0.02)


@pytest.fixture(scope="module")
def names():
    return [n for n, _ in Bloom(CFG).named_parameters()]


@pytest.mark.parametrize("pp", [1, 2])
def test_names_round_trip(names, pp):
    layout = {"tp": 2, "pp": pp, "dp": 1, "zero_stage": 1}
    mapped = [layout_name(n, layout, 4) for n in names]
    assert len(set(mapped)) == len(mapped)
    assert [bloom_name(n, 4) for n in mapped] == names


def test_pipeline_names_are_those_deepspeed_registers():
    """PipelineModule registers layer i of Bloom.layers() as str(i) and the tied embedding under
    tied_modules.embed (names seen in a real TP=2 x PP=2 run of a 4-layer model)."""
    seen = {
        "embedding.word_embeddings.weight": "tied_modules.embed.word_embeddings.weight",
        "embed_ln.weight": "1.weight",
        "blocks.0.attn.qkv.weight": "2.attn.qkv.weight",
        "blocks.3.mlp.fc2.bias": "5.mlp.fc2.bias",
        "final_ln.bias": "6.bias",
    }
    for ours, theirs in seen.items():
        assert pipeline_name(ours, 4) == theirs and bloom_name(theirs, 4) == ours
    with pytest.raises(KeyError):
        bloom_name("7.weight", 4)  # layer 7 is the projection, which has no parameters of its own


def test_every_parameter_has_one_cut(names):
    for n in names:
        want = (
            None
            if re.search(r"(_ln|ln1|ln2)\.|(dense|fc2)\.bias$", n)
            else 1
            if n.endswith(("dense.weight", "fc2.weight"))
            else 0
        )
        assert tp_dim(n) == want, n
    with pytest.raises(KeyError):
        tp_dim("blocks.0.attn.rotary.weight")


@pytest.mark.parametrize("size", [1, 2, 4])
def test_slices_merge_back(names, size):
    model = Bloom(CFG, seed=1)
    rows = CFG.padded_vocab(size)
    for n, p in model.named_parameters():
        parts = [tp_slice(n, p.detach(), r, size, rows) for r in range(size)]
        if tp_dim(n) is not None and size > 1:
            assert all(
                q.shape[tp_dim(n)] * size == (rows if n.startswith("embedding") else p.shape[tp_dim(n)]) for q in parts
            )
        assert torch.equal(tp_merge(n, parts, tp_dim(n), CFG.padded_vocab(1)), p.detach()), n
        assert first_mismatch(parts) is None or tp_dim(n) is not None
