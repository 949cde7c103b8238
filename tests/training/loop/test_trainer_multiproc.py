"""Multi-process training on CPU (gloo): real DeepSpeed launcher, real megatron-core layers,
real checkpoints. One shared set of demo shards; every run is a few steps of bloom-tiny."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from bloomline.config import load_config
from tests.support.train_runs import BASE, ENV, command, launch, metrics, ok
from training.checkpoint.load import load_model
from training.checkpoint.meta import FORMAT_VERSION, read_meta
from training.checkpoint.run_dir import RunDir
from training.config import TrainRecipe
from training.data.shard_reader import ShardIndex
from training.loop.launch import EXIT_USER_ERROR
from training.model.bloom import Bloom
from training.parallel.shm import release_job_shm

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(demo_data):
    return demo_data  # prepared once per session (tests/conftest.py)


def saved_names(step_dir):
    """The parameter names TP rank 0's files hold, as Bloom names (what load_model loads)."""
    from training.checkpoint.load import _rank_weights

    return list(_rank_weights(Path(step_dir), read_meta(step_dir), 0)[0])


REFERENCE_RUN: list[Path] = []


def FLOPS_PER_TOKEN(T: int) -> int:
    with torch.device("meta"):
        return Bloom(load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml").model).flops_per_token(T)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """TP=PP=DP=1, 4 uninterrupted steps."""
    out = tmp_path_factory.mktemp("ref")
    ok(launch(data, out, []))
    REFERENCE_RUN[:] = [out]
    return metrics(out)


def logits_of(step_dir: Path):
    """load_model's whole single-device Bloom on a fixed input."""
    model, meta = load_model(step_dir)
    assert sorted(saved_names(step_dir)) == sorted(model.state_dict())  # the files hold exactly Bloom's names
    ids = torch.randint(0, model.cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids)[..., : model.cfg.vocab_size], meta


def test_resume_is_exact_on_one_rank_from_s3_data_and_a_checkpoint_mirror(data, reference, tmp_path, s3):
    """Two steps, then two more after a resume: every step's loss and grad norm is the
    uninterrupted run's. The data is read from S3 (--data s3://…: the ranks fetch the shards they
    read into the node's cache, each checked against the manifest's sha256), and the resume is on
    a fresh node: the first run's checkpoint is mirrored to S3 by the uploader's thread, and an
    empty run folder pulls it (files, bloomline.json, latest, the metrics log). export (and
    evaluate) read a checkpoint at its URL: the same model as from the local folder."""
    from training.checkpoint.mirror import MirrorUploader, mirrored_steps, pull_latest
    from training.hf.to_hf import export

    url, mirror = f"s3://{s3.bucket}/train-data/demo", f"s3://{s3.bucket}/mirrors/resume"
    s3.fs().put(str(data), url, recursive=True)
    env = {**s3.env, "BLOOMLINE_DATA_CACHE": str(tmp_path / "cache")}
    first = RunDir(tmp_path / "first")
    ok(launch(url, first.root, ["train.steps=2"], **env))
    said = []
    MirrorUploader(first, mirror, keep=2, say=said.append).close()
    assert mirrored_steps(mirror) == [2] and said[0].startswith(f"checkpoint step 2 mirrored to {mirror} (")
    out = tmp_path / "run"  # the fresh node's run folder
    out.mkdir()
    assert pull_latest(RunDir(out), mirror) == 2 and pull_latest(RunDir(out), mirror) is None
    res = launch(url, out, [], **env)
    ok(res)
    cached = list((tmp_path / "cache").rglob("shards/**/*.arrow"))
    assert cached and all((data / p.relative_to(p.parents[3])).read_bytes() == p.read_bytes() for p in cached)
    for src, dest in ((f"{mirror}/checkpoints/step_2", "from-url"), (first.step_dir(2), "local")):
        export(src, tmp_path / dest, data)
    exported = [(tmp_path / d / "model.safetensors").read_bytes() for d in ("from-url", "local")]
    assert exported[0] == exported[1]
    # train.steps went from 2 to 4, but the cosine runs to optim.decay_steps=30 either way
    assert (
        "resuming at step 2 with another LR schedule (train.steps 2 → 4): the LR of step 3 is unchanged" in res.stdout
    )
    assert "step 4/4 | loss " in res.stdout  # the progress line (train.log_interval=1)
    assert "model.attention=auto: sdpa (FlexAttention has no CPU backward)" in res.stdout
    got = metrics(out)
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    assert [(m["loss"], m["grad_norm"]) for m in got] == [(m["loss"], m["grad_norm"]) for m in reference]
    # bloomline.json: the checked contract (training/CHECKPOINT.md)
    meta = read_meta(out / "checkpoints" / "step_4")
    assert meta["data_dir"] == url
    assert (
        meta["format_version"] == FORMAT_VERSION
        and meta["init_from"] is None  # the seed's weights
        and meta["mixture"] is None
        and meta["blend"] == {"rule": "alpha", "alpha": "manifest"}
        and meta["layout"] == {"tp": 1, "pp": 1, "dp": 1, "zero_stage": 1}
    )
    assert meta["model"]["hidden_size"] == 64 and len(meta["data_manifest_sha256"]) == 64
    assert meta["sampler"]["step"] == 4 and sum(meta["sampler"]["tokens_by_lang"].values()) == sum(
        m["global_batch_tokens"] for m in got
    )
    # the epochs per language in the last step's record: what the checkpoint's sampler state implies
    train = ShardIndex(data, "train")
    seen = meta["sampler"]["tokens_by_lang"]
    assert set(got[-1]["lang_epochs"]) == set(train.languages) and set(seen) <= set(train.languages)
    assert got[-1]["lang_epochs"] == {
        lg: pytest.approx(seen.get(lg, 0) / train.lang_tokens(lg), abs=1e-6) for lg in train.languages
    }
    assert meta["tp_rules"]["blocks.0.attn.dense.weight"] == 1 and meta["tp_rules"]["final_ln.weight"] is None
    assert RunDir(out).complete_steps() == [2, 4]  # checkpoint.keep=2
    # every metrics line has the required fields, and TensorBoard got the scalars
    for m in got:
        for k in (
            "step",
            "loss",
            "lr",
            "global_batch_tokens",
            "padding_fraction",
            "dp_balance",
            "dp_time_balance",
            "tokens_per_s",
            "grad_norm",
            "flops",
        ):
            assert m[k] is not None, k
        # sdpa computes the dense square: 6N + 12·L·H·T per padded position, T the step's bucket
        assert m["flops"] == pytest.approx(m["padded_tokens"] * FLOPS_PER_TOKEN(m["bucket"]), rel=1e-9)
        assert m["dp_balance"] == 1.0 and m["dp_time_balance"] == 1.0 and m["attention"] == "sdpa"  # one rank
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_3d_layout_trains_resumes_and_loads_as_the_single_device_model(data, tmp_path_factory):
    """fp32, same data, seed and steps at 1x1x1 and at TP2 x PP2 x DP2: the losses agree, and
    load_model of each last checkpoint gives the same single-device model — the same logits on a
    fixed input. (Resuming with TP and PP: test_resume_on_another_layout_through_a_universal_checkpoint,
    whose TP2 x PP2 run resumes elsewhere; exactly, at one layout: the tests above.)"""
    one, three_d = tmp_path_factory.mktemp("fp32-1x1x1"), tmp_path_factory.mktemp("fp32-3d")
    ok(launch(data, one, ["train.precision=fp32"]))
    ok(launch(data, three_d, ["train.precision=fp32", "parallel.tp=2", "parallel.pp=2", "parallel.dp=2"]))
    a, b = metrics(one), metrics(three_d)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5) and y["grad_norm"] == pytest.approx(
            x["grad_norm"], rel=1e-3
        )
    # dense sdpa on equal shapes: both DP ranks compute the same FLOPs, so their balance is 1 by
    # construction (tests/training/planning/test_flops.py checks balance_over_dp on unequal work); the
    # measured forward times are two real clock readings, never exactly equal: a constant, or one
    # rank's own figure copied, would give exactly 1.0
    assert all(m["dp_balance"] == 1.0 and m["dp_time_balance"] > 1.0 for m in b)
    assert all(m["flops"] == pytest.approx(m["padded_tokens"] * FLOPS_PER_TOKEN(m["bucket"]), rel=1e-9) for m in b)
    ck = three_d / "checkpoints" / "step_4"
    assert len(list(ck.glob("*optim_states.pt"))) == 8  # one ZeRO-1 shard per rank
    # the 8 ranks each hashed a share of the files; bloomline.json records them all, as they are
    from training.checkpoint.integrity import checkpoint_files, damage

    assert sorted(read_meta(ck)["files"]) == checkpoint_files(ck)
    assert len(checkpoint_files(ck)) == len(list(ck.glob("*.pt"))) > 8
    assert damage(ck) is None
    la, _ = logits_of(one / "checkpoints" / "step_4")
    lb, meta = logits_of(ck)
    assert meta["layout"] == {"tp": 2, "pp": 2, "dp": 2, "zero_stage": 1}
    diff = (la - lb).abs().max().item()
    print(f"load_model: max |logit difference| 1x1x1 vs TP2xPP2xDP2 after 4 fp32 steps = {diff:.3g}")
    assert diff < 1e-4
    # and the per-language evaluation gives the same numbers whatever layout wrote the checkpoint
    from eval.publish import evaluate
    from training.config import EvalConfig

    cfg = EvalConfig(max_tokens_per_lang=300, prompts_per_lang=0)
    ea, eb = evaluate(one / "checkpoints" / "step_4", data, cfg, "a"), evaluate(ck, data, cfg, "b")
    assert len(ea.validation()) == len(eb.validation()) > 50
    for x, y in zip(ea.validation(), eb.validation()):
        assert (x["lang"], x["tokens"], x["bytes"]) == (y["lang"], y["tokens"], y["bytes"])
        assert y["bpb"] == pytest.approx(x["bpb"], rel=1e-6) and y["loss"] == pytest.approx(x["loss"], rel=1e-6)
    assert eb.rows[0]["layout"] == "tp=2 pp=2 dp=2 zero_stage=1"
    # exported from the 3D checkpoint, transformers' BloomForCausalLM computes the same logits
    from transformers import AutoModelForCausalLM

    from training.hf.to_hf import export

    hf_dir = export(ck, tmp_path_factory.mktemp("hf"))
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True).eval()
    ids = torch.randint(0, hf.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hd = (hf(ids).logits - lb).abs().max().item()
    print(f"HF export of the TP2xPP2xDP2 checkpoint: max |logit difference| against load_model = {hd:.3g}")
    assert hf.config.vocab_size == 4000 and hd < 1e-4


def test_resume_on_another_layout_through_a_universal_checkpoint(data, reference, tmp_path):
    """TP=2 x PP=2 (ZeRO-1) for two steps, then TP=1 x PP=1 x DP=2 (ZeRO-2) for two more: the
    TP slices are merged, the pipeline stages joined and the optimizer state re-partitioned."""
    from flows.stages.train import reshard_if_needed

    ok(launch(data, tmp_path, ["parallel.tp=2", "parallel.pp=2", "train.steps=2"]))
    new = ["parallel.dp=2", "parallel.zero_stage=2"]
    res = launch(data, tmp_path, new)  # the ranks alone do not convert: a clear refusal
    assert res.returncode != 0
    assert "this run has tp=1 pp=1 dp=2 zero_stage=2" in res.stderr
    assert "python -m training.checkpoint.reshard" in res.stderr and "--dp 2 --zero-stage 2" in res.stderr
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", [*BASE, *new])
    assert reshard_if_needed(tmp_path, recipe, data, tmp_path / "reshard.log") == (
        "step_2: tp=2 pp=2 dp=1 zero_stage=1 -> tp=1 pp=1 dp=2 zero_stage=2"
    )
    assert reshard_if_needed(tmp_path, recipe, data, tmp_path / "reshard.log") is None  # done once
    res = launch(data, tmp_path, new)
    ok(res)
    assert "(universal form, another layout) at step 2" in res.stdout
    got = metrics(tmp_path)
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    for a, b in zip(got, reference):  # weights and Adam moments carried over: the run goes on as before
        assert abs(a["loss"] - b["loss"]) < 2e-3 * b["loss"], (a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 2e-2 * b["grad_norm"], (a["grad_norm"], b["grad_norm"])
    assert read_meta(tmp_path / "checkpoints" / "step_4")["layout"]["dp"] == 2  # new checkpoints are in the new layout


def test_optimizer_offload_resumes_and_trains_as_on_the_device(data, reference, tmp_path):
    """The reference run's step 2 (torch's AdamW) resumed with parallel.offload_optimizer=cpu: steps
    3-4, stepped by DeepSpeed's CPU Adam on the CPU's fp32 partition, give the reference's losses.
    The same fp32 AdamW update in another order of operations: the master weights differ by fp32
    rounding, below what the bf16 weights resolve (measured: equal losses, grad norms within 4e-7);
    1e-5 leaves room for a bf16 rounding that flips, and is far below the 2e-3 of a DP reduction order."""
    shutil.copytree(REFERENCE_RUN[0], tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "checkpoints" / "step_4")
    (tmp_path / "checkpoints" / "latest").write_text("step_2")
    ok(launch(data, tmp_path, ["parallel.offload_optimizer=cpu"]))
    got = metrics(tmp_path)
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    for x, y in zip(got, reference):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5) and x["grad_norm"] == pytest.approx(
            y["grad_norm"], rel=1e-3
        )
    # CPU Adam stepped (its groups carry bias_correction; torch's AdamW's do not)
    (f,) = (tmp_path / "checkpoints" / "step_4").glob("*optim_states.pt")
    groups = torch.load(f, map_location="cpu", weights_only=False)["optimizer_state_dict"]["base_optimizer_state"]
    assert all(g["bias_correction"] for g in groups["param_groups"])


def test_duplicated_parameters_stay_identical_across_tp_ranks(data, tmp_path):
    """BLOOM-176B lost weeks to LayerNorm weights drifting apart on TP ranks. After 8 bf16 steps
    at TP=2 (one bf16 rounding apart would show after the first), load_model finds every
    TP-replicated parameter bitwise equal on both ranks (it checks before merging); a checkpoint
    where one copy drifted is refused with the parameter's name."""
    ok(launch(data, tmp_path, ["parallel.tp=2", "train.steps=8", "checkpoint.interval=8"]))
    ck = tmp_path / "checkpoints" / "step_8"
    model, meta = load_model(ck)
    assert sum(v is None for v in meta["tp_rules"].values()) == 4 * 6 + 4  # ln1, ln2, dense.bias, fc2.bias; 2 norms
    assert metrics(tmp_path)[-1]["loss"] < metrics(tmp_path)[0]["loss"]  # and it learns
    # drift one LayerNorm weight of TP rank 1 by one bf16 step
    f = ck / "mp_rank_01_model_states.pt"
    sd = torch.load(f, map_location="cpu", weights_only=False)
    w = sd["module"]["blocks.2.ln2.weight"]
    w[7] = w[7] * 1.02  # one or two bf16 steps away
    torch.save(sd, f)
    with pytest.raises(Exception, match="parameter blocks.2.ln2.weight differs between TP rank 0 and TP rank 1"):
        load_model(ck)


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_data_parallel_without_pp(data, reference, tmp_path, stage):
    ok(launch(data, tmp_path, ["parallel.dp=2", f"parallel.zero_stage={stage}"]))
    for a, b in zip(metrics(tmp_path), reference):
        assert abs(a["loss"] - b["loss"]) < 2e-3 * b["loss"]
    if stage == 3:
        # ZeRO-3 saves no whole weights: load_model gathers the partitions of both DP ranks
        got, _ = logits_of(tmp_path / "checkpoints" / "step_4")
        want, _ = logits_of(REFERENCE_RUN[0] / "checkpoints" / "step_4")
        assert (got - want).abs().max().item() < 0.05  # the same bf16 training, up to DP reduction order


def test_nan_fault_drill_skips_the_batch(data, tmp_path):
    res = launch(data, tmp_path, ["train.steps=3"], BLOOMLINE_NAN_AT="2")
    ok(res)
    # bf16 on a CPU without bf16 instructions: its products in fp32 (training/model/reduced_on_cpu.py), said
    from training.model.reduced_on_cpu import needs_fp32_products

    said = "train.precision=bf16: matrix products in fp32, rounded to bf16" in res.stdout
    assert said == needs_fp32_products(torch.bfloat16, torch.device("cpu")), res.stdout[-2000:]
    got = metrics(tmp_path)
    assert [m["skipped"] for m in got] == [False, True, False]
    assert got[1]["loss"] is None and got[1]["skip_reason"] == "bad_loss" and got[-1]["skipped_batches"] == 1


def test_kill_switch_saves_mid_run_and_exits_cleanly(data, tmp_path):
    """STOP touched while a long run trains, between checkpoints: the job saves the step it is
    at, exits 0, and a resume goes on from there."""
    cmd = command(data, tmp_path, ["train.steps=500", "checkpoint.interval=1000", "batch.tokens_per_step=2048"])
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if (tmp_path / "metrics.jsonl").exists() and len(metrics(tmp_path)) >= 2:
                (tmp_path / "STOP").touch()
                break
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        release_job_shm(cmd)
    assert proc.returncode == 0, out[-3000:]
    k = len(metrics(tmp_path))
    assert 2 <= k < 500 and f"kill switch {tmp_path / 'STOP'}: saved step {k}, exiting" in out
    assert RunDir(tmp_path).latest_step() == k and RunDir(tmp_path).complete_steps() == [k]
    (tmp_path / "STOP").unlink()
    res = launch(data, tmp_path, [f"train.steps={k + 2}", "checkpoint.interval=1000", "batch.tokens_per_step=2048"])
    ok(res)
    assert f"at step {k}" in res.stdout and [m["step"] for m in metrics(tmp_path)] == list(range(1, k + 3))


def test_corrupt_shard_stops_every_rank_before_the_first_step_with_a_user_error(data, tmp_path):
    bad = tmp_path / "data"
    shutil.copytree(data, bad)
    victim = (
        bad
        / [s for s in json.loads((bad / "manifest.json").read_text())["shards"] if s["split"] == "train"][-1]["path"]
    )
    blob = bytearray(victim.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # inside the data: the file still parses, only its checksum tells
    victim.write_bytes(bytes(blob))
    res = launch(bad, tmp_path / "run", ["parallel.dp=2"])
    assert res.returncode == EXIT_USER_ERROR, (res.stdout + res.stderr)[-3000:]
    assert f"error: shard {victim} is corrupt" in res.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_one_optimizer_step_per_step_when_micro_batch_count_varies(data, tmp_path):
    """During batch-size ramp-up the number of micro-batches grows from step to step: DeepSpeed
    must still step the optimizer exactly once, at the end of each step."""
    ok(
        launch(
            data,
            tmp_path,
            [
                "train.steps=6",
                "batch.micro_batch_tokens=1024",
                "batch.tokens_per_step=12288",
                "batch.rampup_start_tokens=4096",
                "batch.rampup_increment_tokens=4096",
                "batch.rampup_tokens=16000",
            ],
        )
    )
    got = metrics(tmp_path)
    assert len({m["micro_batches"] for m in got}) > 1, "the test needs steps with different micro-batch counts"
    assert [m["optimizer_steps"] for m in got] == [m["step"] for m in got]


# fp16 on this CPU runs on torch's reference half kernels (BLOOMLINE_CPU_FP16): DeepSpeed's real fp16
# optimizer and dynamic loss scaler. 2**22 is too large a scale for bloom-tiny's first gradients
# (measured: they overflow up to 2**21), so the scaler has to calibrate itself.
CPU_FP16 = {"BLOOMLINE_CPU_FP16": "1"}
FP16 = [
    "train.precision=fp16",
    "train.fp16_initial_scale_power=22",
    "train.fp16_hysteresis=1",
    "batch.tokens_per_step=2048",
]


def test_fp16_dynamic_loss_scaling_calibrates_resumes_and_runs_in_3d(data, tmp_path):
    ok(launch(data, tmp_path / "full", FP16, **CPU_FP16))
    full = metrics(tmp_path / "full")
    assert full[0]["skip_reason"] == "fp16_overflow" and full[0]["grad_norm"] is None
    scale = 2.0**22
    for m in full:  # each overflow halves the scale (hysteresis 1); clean steps keep it (window 1000)
        overflow = m["skip_reason"] == "fp16_overflow"
        scale = scale / 2 if overflow else scale
        assert m["loss_scale"] == scale and m["skipped"] == overflow and m["skipped_batches"] == 0
    assert any(m["grad_norm"] is not None for m in full), "the scaler never settled"

    # Stop after step 2 and resume: the loss scaler's state travels in the checkpoint, so
    # steps 3-4 match (a scaler reset to 2**22 would overflow again).
    part = tmp_path / "part"
    ok(launch(data, part, [*FP16, "train.steps=2"], **CPU_FP16))
    ok(launch(data, part, FP16, **CPU_FP16))
    keys = ("loss", "grad_norm", "loss_scale", "skip_reason")
    assert [[m[k] for k in keys] for m in metrics(part)] == [[m[k] for k in keys] for m in full]

    # TP=2 x PP=2: DeepSpeed's pipeline engine with the ZeRO-1 fp16 optimizer. Same initial
    # weights and first batch, so step 1's loss agrees within fp16 rounding.
    ok(launch(data, tmp_path / "3d", [*FP16, "parallel.tp=2", "parallel.pp=2"], **CPU_FP16))
    m3 = metrics(tmp_path / "3d")
    assert abs(m3[0]["loss"] - full[0]["loss"]) < 1e-3 * full[0]["loss"]
    assert len(m3) == 4 and any(m["grad_norm"] is not None for m in m3) and m3[-1]["loss_scale"] < 2.0**22
