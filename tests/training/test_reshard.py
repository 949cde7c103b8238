"""Parameter names across layouts (the universal checkpoint finds a parameter by its name)."""

from pathlib import Path

import pytest

from bloomline.config import load_config
from training.config import TrainRecipe
from training.parallelize import SequentialBloom
from training.reshard import canonical_name, layout_name, layout_of, universal_info

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def names():
    """The single-device model's parameter names: the canonical ones."""
    cfg = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml").model
    return [n for n, _ in SequentialBloom(cfg, None, 1).named_parameters()], cfg.num_layers


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_names_round_trip_in_every_layout(names, tp, pp):
    canon, layers = names
    mapped = [layout_name(n, tp, pp, layers) for n in canon]
    assert len(set(mapped)) == len(mapped)
    assert [canonical_name(n) for n in mapped] == canon


def test_names_are_those_deepspeed_writes(names):
    """Spot checks against the names in a real TP=2 x PP=2 checkpoint of bloom-tiny (4 layers)."""
    _, layers = names
    seen = {"embedding.word_embeddings.weight": "tied_modules.embed.word_embeddings.weight",
            "embed_norm.embed_ln.weight": "1.embed_ln.weight",
            "blocks.0.block.attn.qkv.weight": "2.block.attn.qkv.inner.weight",
            "blocks.3.block.mlp.fc2.bias": "5.block.mlp.fc2.inner.bias",
            "blocks.1.block.ln2.bias": "3.block.ln2.bias",
            "final_norm.final_ln.bias": "6.final_ln.bias"}
    for canon, written in seen.items():
        assert layout_name(canon, 2, 2, layers) == written
        assert canonical_name(written) == canon


def test_tp_merge_patterns_cover_every_parameter_once(names):
    """Each parameter is replicated, row-parallel (dim 1) or column/vocab-parallel (dim 0, the
    converter's default); none may match two categories."""
    import re

    canon, layers = names
    info = universal_info(4096)
    repl, row = info["tp_replicated_parameter_patterns"], info["parameter_with_row_parallelism_patterns"]
    for n in canon:
        tp_name = layout_name(n, 2, 1, layers)
        hits = [p for p in repl + row if re.match(p, tp_name)]
        assert len(hits) <= 1, (n, hits)
        kind = "replicated" if any(re.match(p, tp_name) for p in repl) else "row" if hits else "dim0"
        expected = ("replicated" if ("_ln" in n or "ln1" in n or "ln2" in n or n.endswith(("dense.bias", "fc2.bias")))
                    else "row" if n.endswith(("dense.weight", "fc2.weight")) else "dim0")
        assert kind == expected, (n, kind)


def test_layout_of_reads_config_objects_and_checkpoint_dicts():
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.dp=2"])
    assert layout_of(r.parallel) == {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 1}
    assert layout_of({"tp": 2, "pp": 1, "dp": 1, "zero_stage": 3, "backend": "gloo"})["zero_stage"] == 3


def test_unconvertible_checkpoints_are_refused_with_the_reason(tmp_path):
    from training.reshard import check_convertible

    z1 = {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 1}
    meta = lambda layout, **kw: {"config": {"parallel": layout}, "step": 4, "skipped": 1, **kw}  # noqa: E731
    check_convertible(tmp_path, meta(z1), {**z1, "dp": 1, "zero_stage": 2})  # 1 and 2 convert freely
    for src, dst in [({**z1, "zero_stage": 3}, z1), (z1, {**z1, "zero_stage": 3}), ({**z1, "zero_stage": 0}, z1),
                     (z1, {**z1, "zero_stage": 0})]:
        with pytest.raises(ValueError, match="layout changes work between ZeRO stages 1 and 2"):
            check_convertible(tmp_path, meta(src), dst)
    with pytest.raises(ValueError, match="every step so far was skipped"):
        check_convertible(tmp_path, meta(z1, fp16_overflows=3), {**z1, "dp": 1})
