"""The cost model and the computed-work counts (training/planning/flops.py) against brute force."""

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bloomline.config import load_config
from training.config import ModelConfig
from training.model.bloom import Bloom, segment_ids_from_offsets
from training.planning.flops import (
    ForwardTimer,
    balance_over_dp,
    computed_pairs,
    document_pairs,
    model_pair_weight,
    model_params,
    step_flops,
)

REPO = Path(__file__).resolve().parents[3]


def allowed(seg):
    """The document-causal mask as the kernels apply it, [B, T, T] bool."""
    T = seg.shape[1]
    q, kv = torch.arange(T)[:, None], torch.arange(T)[None, :]
    same = seg[:, :, None] == seg[:, None, :]
    return ((q >= kv) & same & (seg[:, :, None] != 0)) | (q == kv)


def brute_tiles(seg, block=128):
    """Pairs of the tiles in which some query may see some key, tile by tile."""
    a = allowed(seg)
    B, T, _ = a.shape
    total = 0
    for i in range(0, T, block):
        for j in range(0, T, block):
            tile = a[:, i : i + block, j : j + block]
            total += int(tile.flatten(1).any(1).sum()) * tile.shape[1] * tile.shape[2]
    return total


@pytest.mark.parametrize("T", [64, 256, 300])
def test_flex_pairs_are_the_tiles_its_mask_computes(T):
    # documents of length 1, a document cut by the sample's end, padding, one whole-row document
    offsets = [[0, 1, 2, 3, 4, 40], [0, T // 3, T // 2], [0, 20, 21], [0]]
    lengths = [T, T, 50, T]
    seg = segment_ids_from_offsets(offsets, lengths, T)
    got = computed_pairs(seg, "flex")
    assert got == brute_tiles(seg)
    assert computed_pairs(seg, "sdpa") == 4 * T * T
    if T == 256:  # documents skip tiles: flex computes less than the dense square
        assert got < 4 * T * T
    # the admitted pairs (the sampler's model) are what the mask allows within the real tokens
    for b, (off, n) in enumerate(zip(offsets, lengths)):
        assert document_pairs(np.array(off), n) == int(allowed(seg[b : b + 1])[0, :n, :n].sum())


def test_step_flops_split_linear_and_attention():
    seg = segment_ids_from_offsets([[0, 10], [0]], [100, 128], 128)
    lin, att = step_flops([{"segment_ids": seg}], "sdpa", num_layers=2, hidden_size=64, num_params=1000)
    assert lin == 6 * 1000 * 2 * 128 and att == 12 * 2 * 64 * 2 * 128 * 128


def test_model_counts_match_the_built_model():
    tiny = load_config(ModelConfig, REPO / "configs/model/bloom-tiny.yaml")
    assert model_params(tiny) == Bloom(tiny).num_params()
    m560 = load_config(ModelConfig, REPO / "configs/model/bloom-560m.yaml")
    assert model_params(m560) == 559_214_592
    assert model_pair_weight(m560) == pytest.approx(12 * 24 * 1024 / (6 * 559_214_592))


def test_balance_over_dp_compares_ranks_of_one_position():
    # (dp, tp, pp, value): TP2 x DP2; position tp=1 is worse; a middle stage measuring 0 is ignored
    rows = np.array([[0, 0, 0, 10.0], [1, 0, 0, 10.0], [0, 1, 0, 9.0], [1, 1, 0, 11.0], [0, 0, 1, 0.0], [1, 0, 1, 0.0]])
    assert balance_over_dp(rows) == pytest.approx(1.1)
    assert balance_over_dp(rows[4:]) is None


def test_forward_timer_times_forward_passes_only():
    lin = torch.nn.Linear(256, 256)
    t = ForwardTimer(lin)
    x = torch.randn(512, 256)
    t0 = time.perf_counter()
    lin(x).sum().backward()
    lin(x)
    took = time.perf_counter() - t0
    s = t.take()
    assert 0 < s < took and t.take() == 0.0
    t.remove()
    lin(x)
    assert t.take() == 0.0
