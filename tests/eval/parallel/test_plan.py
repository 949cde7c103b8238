"""The evaluation layout ``bloomline plan`` proposes (eval/parallel/plan.py)."""

from pathlib import Path

import pytest

from bloomline.config import load_config
from eval.parallel.plan import eval_plan, eval_stages
from training.config import TrainRecipe
from training.planning.planner import DEVICES, GIB, stage_params

REPO = Path(__file__).resolve().parents[3]


def model(name: str):
    return load_config(TrainRecipe, REPO / f"configs/train/{name}.yaml").model


def test_bloom_176b_is_evaluated_on_one_node_of_80_gb_devices_and_needs_two_in_fp32():
    m, a100 = model("bloom-176b"), DEVICES["a100-80gb"]
    p = eval_plan(m, a100, batch_tokens=16384)
    assert p["fits"] and (p["tp"], p["pp"], p["nodes"]) == (8, 1, 1), p["reason"]
    st = p["stages"][0]
    # its weights: the bf16 TP slice of every layer, the embedding's V/8 rows among them
    assert st["weights_gib"] == pytest.approx(stage_params(m, 8, (0, m.num_layers + 4))[0] * 2 / GIB)
    assert 40 < st["weights_gib"] < 45 and st["memory_gib"] <= a100.memory_gib
    # twice the bytes per weight do not fit one node: the fewest nodes, the most TP, then stages
    p32 = eval_plan(m, a100, batch_tokens=16384, precision="fp32")
    assert p32["fits"] and (p32["tp"], p32["nodes"]) == (8, 2) and p32["pp"] == 2, p32["reason"]
    # and 8 devices of one stage each would not hold it
    assert max(s.memory_gib for s in eval_stages(m, 8, 1, 16384, 4, a100)) > a100.memory_gib


def test_a_model_that_fits_one_device_gets_one():
    p = eval_plan(model("bloom-560m"), DEVICES["a100-80gb"], batch_tokens=16384)
    assert (p["tp"], p["pp"], p["world"]) == (1, 1, 1)
    # most of it is the batch's logits over 250,880 tokens (fp32 copy and exponentials beside bf16)
    st = p["stages"][0]
    assert st["logits_gib"] == pytest.approx(16384 * model("bloom-560m").padded_vocab(1) * 10 / GIB)
