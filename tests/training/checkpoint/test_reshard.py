"""The universal-checkpoint merge rules and the conversions we refuse (training/checkpoint/reshard.py)."""

import re

import pytest

from training.checkpoint.reshard import check_convertible
from training.config import ModelConfig
from training.model.bloom import full_shapes
from training.parallel.layout import layout_name, tp_dim, universal_info

CFG = ModelConfig(vocab_size=1000, hidden_size=64, num_layers=4, num_heads=4, seq_len=64, init_std=0.02)


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_merge_patterns_name_each_parameter_by_its_cut(tp, pp):
    """Each of the layout's parameter names matches exactly the category of its TP cut:
    replicated, row-parallel (dim 1), or neither (dim 0, the converter's default)."""
    layout = {"tp": tp, "pp": pp, "dp": 1, "zero_stage": 1}
    info = universal_info(CFG, layout)
    repl, row = info["tp_replicated_parameter_patterns"], info["parameter_with_row_parallelism_patterns"]
    for n in full_shapes(CFG):
        name = layout_name(n, layout, CFG.num_layers)
        kind = (
            "replicated"
            if any(re.match(p, name) for p in repl)
            else "row"
            if any(re.match(p, name) for p in row)
            else "dim0"
        )
        assert kind == {None: "replicated", 1: "row", 0: "dim0"}[tp_dim(n)], (name, kind)
    assert info["original_vocab_size"] == CFG.padded_vocab(tp)


def test_unconvertible_checkpoints_are_refused_with_the_reason(tmp_path):
    z1 = {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 1}
    meta = lambda layout, **kw: {"layout": layout, "step": 4, "trainer": {"skipped": 1, **kw}}  # noqa: E731
    check_convertible(tmp_path, meta(z1), {**z1, "dp": 1, "zero_stage": 2})  # 1, 2 and 3 convert freely
    check_convertible(tmp_path, meta({**z1, "zero_stage": 3}), {**z1, "dp": 1})
    check_convertible(tmp_path, meta(z1), {**z1, "zero_stage": 3})
    for src, dst in [({**z1, "zero_stage": 0}, z1), (z1, {**z1, "zero_stage": 0})]:
        with pytest.raises(ValueError, match="layout changes work between ZeRO stages 1, 2 and 3"):
            check_convertible(tmp_path, meta(src), dst)
    for src, dst in [({**z1, "zero_stage": 3, "tp": 2}, z1), (z1, {**z1, "zero_stage": 3, "tp": 2})]:
        with pytest.raises(ValueError, match="zero_stage=3 with tp=2"):
            check_convertible(tmp_path, meta(src), dst)
    with pytest.raises(ValueError, match="every step so far was skipped"):
        check_convertible(tmp_path, meta(z1, fp16_overflows=3), {**z1, "dp": 1})
