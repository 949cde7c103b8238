"""The universal-checkpoint merge rules, the conversions we refuse, and bf16/fp16 reshards that train on
(training/checkpoint/reshard.py)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.checkpoints import Planted
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


# ------------------------------------------------------------------------------------------------
# Reshards that train on: real runs of bloom-tiny on CPU (gloo), 2048 tokens a step. A run's
# launch (~10 s) costs far more than its steps, so each precision has one uninterrupted run at
# TP=2 x ZeRO-1 (the reference, whose step 2 every reshard starts from) and one chain of reshards.

REPO = Path(__file__).resolve().parents[3]
SMALL = [
    "batch.tokens_per_step=2048",
    "batch.micro_batch_tokens=1024",  # one micro-batch a rank at DP=2: the same batches at every layout
    "optim.decay_steps=30",
    "checkpoint.interval=2",
    "checkpoint.keep=3",
]
# fp16 on this CPU: torch's reference half kernels (BLOOMLINE_CPU_FP16), DeepSpeed's fp16 optimizer
# and loss scaler; a scale the first gradients do not overflow, so no step is skipped
PRECISION = {
    "bf16": (["train.precision=bf16"], {}),
    "fp16": (["train.precision=fp16", "train.fp16_initial_scale_power=12"], {"BLOOMLINE_CPU_FP16": "1"}),
}
TP2_Z1 = {"tp": 2, "pp": 1, "dp": 1, "zero_stage": 1}
TP1_Z3 = {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 3}


def _launch(data: Path, out: Path, overrides: list[str], env: dict[str, str]) -> None:
    from bloomline.config import load_config, to_dict
    from training.config import TrainRecipe
    from training.loop.launch import launch_command
    from training.parallel.shm import release_job_shm

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", [*SMALL, *overrides])
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps(to_dict(r)))
    cmd = launch_command(out / "recipe.json", str(data), str(out), r.parallel.world_size)
    try:
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env={**os.environ, "DS_ACCELERATOR": "cpu", **env},
        )
    finally:
        release_job_shm(cmd)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _layout_overrides(layout: dict[str, int]) -> list[str]:
    return [f"parallel.{k}={v}" for k, v in layout.items()]


@pytest.fixture(scope="module")
def reference(demo_data, tmp_path_factory):
    """``reference(precision)``: the run folder of 6 uninterrupted steps at TP=2 x ZeRO-1 (checkpoints
    at steps 2, 4 and 6), made once per module."""
    runs: dict[str, Path] = {}

    def run(precision: str) -> Path:
        if precision not in runs:
            out = tmp_path_factory.mktemp(f"reference-{precision}")
            overrides, env = PRECISION[precision]
            _launch(demo_data, out, [*overrides, *_layout_overrides(TP2_Z1), "train.steps=6"], env)
            runs[precision] = out
        return runs[precision]

    return run


def _at_step_2(run: Path, dest: Path) -> Path:
    """A copy of ``run`` as it was after step 2 (its later checkpoints removed)."""
    shutil.copytree(run, dest)
    for d in (dest / "checkpoints").glob("step_*"):
        if d.name != "step_2":
            shutil.rmtree(d)
    (dest / "checkpoints" / "latest").write_text("step_2")
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_reshards_both_ways_and_trains_on(precision, demo_data, reference, tmp_path):
    """The reference's step 2 (TP=2 x ZeRO-1) resumed at TP=1 x ZeRO-3 x DP=2 for steps 3-4, and that
    step 4 at TP=2 x ZeRO-1 again for steps 5-6: TP slices merged and cut again, ZeRO-1 to 3 and
    back, and the run goes on as the uninterrupted one. A checkpoint at TP > 1 without pipeline holds
    megatron-core's empty ``_extra_state`` entries, which DeepSpeed 0.19.8's converter fails on
    (reshard.py, _converter_input); a tp change with ZeRO-3 on one side needs the model states'
    ``mp_world_size`` of the target (_name_model_states)."""
    from training.checkpoint.meta import read_meta
    from training.checkpoint.reshard import MARKER, convert

    ref = reference(precision)
    run = _at_step_2(ref, tmp_path / "run")
    overrides, env = PRECISION[precision]
    for step, layout, steps in ((2, TP1_Z3, 4), (4, TP2_Z1, 6)):
        universal = convert(run / "checkpoints" / f"step_{step}", layout)
        assert json.loads((universal / MARKER).read_text())["layout"] == layout
        _launch(demo_data, run, [*overrides, *_layout_overrides(layout), f"train.steps={steps}"], env)
        assert read_meta(run / "checkpoints" / f"step_{steps}")["layout"] == layout
    got, want = _metrics(run), _metrics(ref)
    assert [m["step"] for m in got] == [1, 2, 3, 4, 5, 6]
    assert not any(m["skipped"] for m in want)
    for a, b in zip(got[2:], want[2:]):  # weights, Adam moments and step carried over
        assert abs(a["loss"] - b["loss"]) < 2e-3 * b["loss"], (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 2e-2 * b["grad_norm"], (a["step"], a["grad_norm"], b["grad_norm"])


FORKSERVER_CONVERT = """
import multiprocessing, sys
from pathlib import Path
multiprocessing.set_start_method("forkserver")  # Python 3.14's default on Linux
from training.checkpoint import reshard
reshard.available_cpus = lambda: 3  # two extract workers: a pool, as on any machine with 3 CPUs or more
reshard.check_folder = lambda *a, **k: 0  # a file swapped after the up-front check: only enforced() stands
try:
    reshard.convert(Path(sys.argv[1]), {"tp": 1, "pp": 1, "dp": 1, "zero_stage": 1})
except Exception as e:
    print(f"refused: {e}")
"""


@pytest.mark.slow
def test_converter_workers_load_as_the_safe_loader_whatever_the_default_start_method(reference, tmp_path):
    """ds_to_universal's extract workers load TP rank 1's optimizer state (the main process never
    does): with multiprocessing's default start method set to 'forkserver', they still start as
    forks of the converting process, so its safe ``torch.load`` refuses a file that names code."""
    step = _at_step_2(reference("bf16"), tmp_path / "run") / "checkpoints" / "step_2"
    (f,) = step.glob("*_mp_rank_01_optim_states.pt")
    sd = torch.load(f, weights_only=False)
    marker = tmp_path / "ran"
    sd["planted"] = Planted(marker)
    torch.save(sd, f)
    res = subprocess.run(
        [sys.executable, "-c", FORKSERVER_CONVERT, str(step)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert not marker.exists(), "a converter worker loaded the file with weights_only=False"
    # (a worker reads it through the converter's input folder: reshard.py, _converter_input)
    assert f"{f.name} is refused: it names posix.system" in res.stdout, (res.stdout + res.stderr)[-4000:]
