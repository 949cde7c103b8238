"""The planner against BLOOM-176B's published facts (bigscience tr11-176B-ml: README, slurm
script, chronicles), DeepSpeed's own estimators, and the trainer's own partition."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bloomline.config import load_config
from training.config import TrainRecipe
from training.planner import DEVICES, GIB, cpu_device, plan, stage_layout, stage_params

REPO = Path(__file__).resolve().parents[2]


def bloom176(mbs: int = 2, **parallel) -> TrainRecipe:
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-176b.yaml")
    r.batch.micro_batch_tokens = mbs * 2048
    for k, v in parallel.items():
        setattr(r.parallel, k, v)
    return r


@pytest.mark.parametrize("mbs, observed_gb", [(2, 59), (4, 73)])
def test_bloom_176b_fits_and_stage_0_matches_nvidia_smi(mbs, observed_gb):
    p = plan(bloom176(mbs), DEVICES["a100-80gb"])
    assert p["fits"], p["reason"]
    assert p["layout"] == {"tp": 4, "pp": 12, "dp": 8, "zero_stage": 1, "world": 384, "nodes": 48, "per_node": 8}
    stage0 = p["stages"][0]
    assert abs(stage0["memory_gib"] - observed_gb) / observed_gb <= 0.25, stage0
    assert stage0["memory_gib"] == pytest.approx(sum(stage0["parts_gib"].values()), abs=0.01)
    # checkpointing is what makes it fit: without it, stage 0's activations alone exceed the GPU
    assert stage0["activations_without_checkpointing_gib"] > 80


def test_bloom_176b_flops_and_bubble():
    p = plan(bloom176(), DEVICES["a100-80gb"], iteration_seconds=104.7)
    assert p["tflops_per_gpu"] == pytest.approx(149.77, abs=0.1)  # as BLOOM's logs printed it
    assert p["micro_batches"] == 2048 // (2 * 8) and p["bubble"] == pytest.approx(11 / 128)


def test_bloom_176b_stages_balance_blocks_and_both_embedding_copies():
    """BLOOM's `type:transformer|embedding`: 72 units on 12 stages, 6 each; the embedding
    (and its optimizer states) on the first and the last stage."""
    p = plan(bloom176(), DEVICES["a100-80gb"])
    assert [s["blocks"] for s in p["stages"]] == [5] + [6] * 10 + [5]
    assert [s["embedding"] for s in p["stages"]] == [True] + [False] * 10 + [True]
    last = p["stages"][-1]
    assert last["parts_gib"]["logits"] > 0 and all(s["parts_gib"]["logits"] == 0 for s in p["stages"][:-1])


def test_pure_dp_with_zero_1_does_not_fit_and_says_why():
    p = plan(bloom176(tp=1, pp=1, dp=384), DEVICES["a100-80gb"])
    assert not p["fits"]
    assert "does not fit" in p["reason"] and "stage 0" in p["reason"] and "gradients" in p["reason"]
    assert p["stages"][0]["memory_gib"] > 10 * 80


def test_model_states_agree_with_deepspeeds_estimators():
    ds = plan(bloom176(), DEVICES["a100-80gb"])["deepspeed_estimate"]
    assert ds["zero2_gib"] == pytest.approx(ds["zero2_ours_gib"], rel=1e-6)
    # ZeRO-3: DeepSpeed leaves out the 16-bit weights' own partition, 2 bytes / DP per parameter
    p0 = plan(bloom176(), DEVICES["a100-80gb"])["stages"][0]["params"]
    assert ds["zero3_ours_gib"] - ds["zero3_gib"] == pytest.approx(2 * p0 / 8 / GIB, rel=1e-3)


def test_offload_frees_gpu_memory_and_costs_cpu_memory_and_pcie():
    p = plan(bloom176(), DEVICES["a100-80gb"], iteration_seconds=104.7, offload=True)
    o, s0 = p["offload"], p["stages"][0]
    assert 0 < o["gpu_freed_gib"] < s0["memory_gib"]
    assert s0["offload_memory_gib"] == pytest.approx(s0["memory_gib"] - o["gpu_freed_gib"], abs=0.01)
    assert o["cpu_gib_per_node"] == pytest.approx(8 * o["cpu_gib_per_device"], rel=1e-3)
    assert o["pcie_gib_per_iteration_per_device"] > 0 and 0 < o["pcie_share_of_iteration"] < 1


def test_parameters_per_stage_add_up_to_the_model():
    """At TP=1 the stages hold every parameter once, the tied embedding twice."""
    from training.model import Bloom

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    with torch.device("meta"):
        model = Bloom(r.model)
    emb = model.embedding.word_embeddings.weight.numel()
    for pp in (1, 2, 3):
        total = sum(stage_params(r.model, 1, b)[0] for b in stage_layout(r.model, pp))
        assert total == sum(p.numel() for p in model.parameters()) + (emb if pp > 1 else 0)


def test_the_planner_names_layers_as_the_trainer_builds_them():
    from training.layout import pipeline_prefixes
    from training.model import Bloom
    from training.planner import layer_type

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    with torch.device("meta"):
        model = Bloom(r.model)
    built = [type(layer).__name__ for _, layer in model.layers()] + [type(model.embedding).__name__]
    assert [layer_type(p) for p in pipeline_prefixes(r.model.num_layers)] == built


def test_small_recipes_fit_where_they_are_meant_to_run():
    r560 = load_config(TrainRecipe, REPO / "configs/train/bloom-560m.yaml")
    p = plan(r560, DEVICES["h200"])
    assert p["fits"] and p["layout"]["world"] == 1, p["reason"]
    demo = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    demo.parallel.dp = 2
    p = plan(demo, cpu_device())
    assert p["fits"] and p["stages"][0]["memory_gib"] < 2


def test_cli_json_and_exit_status(tmp_path):
    cmd = [sys.executable, "-m", "flows.cli", "plan", "--config", str(REPO / "configs/train/bloom-176b.yaml"),
           "--iteration-seconds", "104.7", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    p = json.loads(res.stdout)
    assert p["fits"] is True and p["reason"] and p["bubble"] > 0 and p["flops_per_iteration"] > 0
    assert all("memory_gib" in s and "parts_gib" in s for s in p["stages"]) and "tflops_per_gpu" in p
    # a layout that does not fit: exit status 1, and the reason
    res = subprocess.run([*cmd[:-3], "-o", "parallel.tp=1", "-o", "parallel.pp=1", "-o", "parallel.dp=384"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 1 and "does not fit" in res.stderr
    # --nodes rescales DP; a node count the layout cannot use is refused with the reason
    res = subprocess.run([*cmd[:-3], "--nodes", "24", "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert json.loads(res.stdout)["layout"]["dp"] == 4
    res = subprocess.run([*cmd[:-3], "--nodes", "5", "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 1 and "not a multiple" in json.loads(res.stdout)["reason"]
