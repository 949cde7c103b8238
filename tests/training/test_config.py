from pathlib import Path

import pytest
import yaml

from bloomline.config import from_dict, load_config
from bloomline.errors import ConfigError
from training.config import ModelConfig, ParallelConfig, TrainRecipe

REPO = Path(__file__).resolve().parents[2]


def test_parallel_validation_messages():
    with pytest.raises(ConfigError, match="tp·pp·dp = 2·2·2 = 8 does not match the world size 4"):
        ParallelConfig(tp=2, pp=2, dp=2).check_world(4)
    with pytest.raises(ConfigError, match="ZeRO stage 2 cannot be combined with pipeline parallelism"):
        from_dict(ParallelConfig, {"pp": 2, "zero_stage": 2})
    from_dict(ParallelConfig, {"pp": 1, "zero_stage": 3})  # fine without PP
    m = ModelConfig(hidden_size=64, num_heads=4, num_layers=2)
    with pytest.raises(ConfigError, match="num_heads=4 is not divisible by tp=3"):
        ParallelConfig(tp=3).check_model(m)
    with pytest.raises(ConfigError, match="pp=3 pipeline stages need at least 3 layers"):
        ParallelConfig(pp=3).check_model(m)


def test_overrides_reach_the_named_model_recipe():
    r = load_config(
        TrainRecipe,
        REPO / "configs/train/bloom-tiny.yaml",
        [
            "model.hidden_size=128",
            "parallel.tp=2",
            "parallel.pp=2",
            "parallel.dp=2",
            "train.steps=7",
            "checkpoint.interval=3",
        ],
    )
    assert r.model.hidden_size == 128 and r.model.num_layers == 4
    assert (r.parallel.tp, r.parallel.pp, r.parallel.dp, r.train.steps, r.checkpoint.interval) == (2, 2, 2, 7, 3)
    with pytest.raises(ConfigError, match="model.hidden_size.*num_heads=5"):
        load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["model.num_heads=5"])


def test_bloom_176b_recipe_is_the_published_one():
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-176b.yaml")
    m = r.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.seq_len) == (70, 14336, 112, 2048)
    # the tokenizer's 250,680 pieces; Megatron's rule at BLOOM's TP=4 derives the published 250,880 rows
    assert m.vocab_size == 250680 and m.pad_vocab_to is None
    assert m.padded_vocab(tp=4) == m.padded_vocab(tp=2) == m.padded_vocab(tp=8) == 250880
    assert (r.parallel.tp, r.parallel.pp, r.parallel.dp) == (4, 12, 8)
    assert r.batch.tokens_per_step == 2048 * 2048 and r.batch.rampup_start_tokens == 192 * 2048
    assert r.batch.rampup_increment_tokens == 16 * 2048
    assert (r.optim.lr, r.optim.beta2, r.optim.clip_grad) == (6e-5, 0.95, 1.0)
    assert r.train.precision == "bf16" and r.train.activation_checkpointing


@pytest.mark.parametrize(
    "name, params",
    [
        ("bloom-560m", 559_214_592),
        ("bloom-1b1", 1_065_314_304),
        ("bloom-1b7", 1_722_408_960),
        ("bloom-3b", 3_002_557_440),
        ("bloom-7b1", 7_069_016_064),
    ],
)
def test_the_published_blooms_have_their_model_recipes(name, params):
    """Each model recipe holds the published model's parameters, as transformers counts them
    (``BloomForCausalLM.num_parameters()``: the tied embedding once)."""
    from training.model.bloom import full_shapes

    cfg = from_dict(ModelConfig, yaml.safe_load((REPO / "configs" / "model" / f"{name}.yaml").read_text()))
    assert sum(s.numel() for s in full_shapes(cfg).values()) == params


def test_lr_schedule():
    from training.loop.schedule import lr_at

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["optim.warmup_steps=10", "train.steps=110"])
    assert lr_at(5, r) == pytest.approx(r.optim.lr / 2)
    assert lr_at(10, r) == pytest.approx(r.optim.lr)
    assert lr_at(60, r) == pytest.approx((r.optim.lr + r.optim.min_lr) / 2)
    assert lr_at(110, r) == pytest.approx(r.optim.min_lr)


def test_step_loss_scaling_and_bad_batch_poisoning():
    """The loss DeepSpeed sees: token sum × gas·dp / step tokens; NaN when the batch must be skipped."""
    import math

    import torch

    from training.loop.loss import StepLoss

    logits = torch.zeros(2, 3, 8)
    labels = torch.tensor([[1, 2, -100], [3, -100, -100]])
    loss = StepLoss()
    loss.set_step(gas=2, dp=2, step_tokens=12)
    expected = 3 * math.log(8) * 2 * 2 / 12  # three labelled tokens of uniform logits
    assert float(loss(logits, labels)) == pytest.approx(expected)
    loss.set_step(gas=2, dp=2, step_tokens=12, spike_limit=math.log(8) - 0.01)  # mean token loss is log 8
    assert math.isnan(float(loss(logits, labels))) and loss.bad
    loss.set_step(gas=2, dp=2, step_tokens=12, spike_limit=math.log(8) + 0.01)
    assert not math.isnan(float(loss(logits, labels))) and not loss.bad
    bad = logits.clone()
    bad[0, 0, 0] = float("inf")
    loss.set_step(gas=1, dp=1, step_tokens=3)
    assert math.isnan(float(loss(bad, labels)))


def test_validation_holes_are_refused_under_the_right_key():
    base = REPO / "configs/train/bloom-tiny.yaml"
    for override, key in [
        ("batch.rampup_increment_tokens=0", "batch.rampup_increment_tokens"),
        ("optim.lr=0", "optim.lr"),
        ("optim.min_lr=1.0", "optim.min_lr"),
        ("optim.decay_steps=3", "optim.decay_steps"),  # not after the 5 warm-up steps
        ("optim.beta1=1.5", "optim.beta1"),
        ("train.log_interval=0", "train.log_interval"),
        ("model.pad_vocab_to=100", "model.pad_vocab_to"),
    ]:
        with pytest.raises(ConfigError, match=f"config key '{key}'"):
            load_config(TrainRecipe, base, [override])
    # a BLOOM-560m recipe moved to another tokenizer: its fixed 250,880-row table is refused
    with pytest.raises(ConfigError, match="config key 'model.pad_vocab_to': 250880 rows for a 8000-piece tokenizer"):
        load_config(TrainRecipe, REPO / "configs/train/bloom-560m.yaml", ["model.vocab_size=8000"])
    load_config(
        TrainRecipe, REPO / "configs/train/bloom-560m.yaml", ["model.vocab_size=8000", "model.pad_vocab_to=null"]
    )
    with pytest.raises(ConfigError, match="model.pad_vocab_to.*do not split over tp=3"):
        ParallelConfig(tp=3).check_model(ModelConfig(vocab_size=100, pad_vocab_to=128, hidden_size=48, num_heads=3))


def test_blooms_own_vocabulary_passes_the_data_check():
    """BLOOM's tokenizer has 250,680 pieces. Data made with it fits BLOOM's recipe (which pads the
    table to 250,880 rows, a multiple of 128·TP); data of another tokenizer does not, and the
    message names the key to set."""
    from data_prep.storage.shards import check_model_fits

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-176b.yaml")
    manifest = {"tokenizer": {"vocab_size": 250680}, "buckets": [512, 1024, 2048]}
    check_model_fits(manifest, "DATA", r.model.vocab_size, r.model.seq_len)
    assert r.model.padded_vocab(r.parallel.tp) % (128 * r.parallel.tp) == 0
    with pytest.raises(ConfigError, match="model.vocab_size.*tokenized with a 250880-piece tokenizer"):
        check_model_fits({**manifest, "tokenizer": {"vocab_size": 250880}}, "DATA", r.model.vocab_size, 2048)
    with pytest.raises(ConfigError, match="model.seq_len.*largest bucket is 2048"):
        check_model_fits(manifest, "DATA", r.model.vocab_size, 1024)


def test_a_resume_that_changes_the_lr_schedule_says_so():
    from training.loop.schedule import lr_at, schedule_change

    base = REPO / "configs/train/bloom-tiny.yaml"
    before = load_config(TrainRecipe, base, ["train.steps=30", "optim.warmup_steps=5"])
    assert (
        schedule_change(
            before, load_config(TrainRecipe, base, ["train.steps=30", "optim.warmup_steps=5", "parallel.dp=2"]), 20
        )
        is None
    )
    after = load_config(TrainRecipe, base, ["train.steps=60", "optim.warmup_steps=5"])
    msg = schedule_change(before, after, 20)
    a, b = lr_at(21, before), lr_at(21, after)
    assert b > a  # a longer run: the cosine is stretched and the LR jumps back up
    assert msg == (
        f"resuming at step 20 with another LR schedule (train.steps 30 → 60): the LR of step 21 is "
        f"{a:.4g} → {b:.4g} ({(b - a) / a:+.1%})"
    )


def test_recipe_rules_and_what_they_need_of_the_machine(monkeypatch):
    """The recipe's own rules are checked where it loads; what it needs of the machine, by check_device."""
    tiny = REPO / "configs/train/bloom-tiny.yaml"
    with pytest.raises(ConfigError, match="parallel.zero_stage.*fp32 with zero_stage 0 cannot skip a NaN"):
        load_config(TrainRecipe, tiny, ["train.precision=fp32", "parallel.zero_stage=0"])
    load_config(TrainRecipe, tiny, ["train.precision=bf16", "parallel.zero_stage=0"]).check_device(gpu=False)
    fp16 = load_config(TrainRecipe, tiny, ["train.precision=fp16"])
    with pytest.raises(ConfigError, match="train.precision.*fp16 needs GPUs"):
        fp16.check_device(gpu=False)
    fp16.check_device(gpu=True)
    monkeypatch.setenv("BLOOMLINE_CPU_FP16", "1")  # the tests' switch (training/config/drills.py)
    fp16.check_device(gpu=False)
    monkeypatch.delenv("BLOOMLINE_CPU_FP16")
    flex = load_config(TrainRecipe, tiny, ["model.attention=flex"])
    with pytest.raises(ConfigError, match="model.attention.*flex cannot train on CPU"):
        flex.check_device(gpu=False)
    flex.check_device(gpu=True)
    steer = ["batch.mixture=online", "batch.online.rule=evaluation", "batch.online.signal=continuation"]
    load_config(TrainRecipe, tiny, steer)  # bloom-tiny's evaluation runs the continuation task
    with pytest.raises(ConfigError, match="batch.online.signal.*add \\{name: continuation\\}"):
        load_config(TrainRecipe, tiny, [*steer, "evaluation.settings.tasks=[]"])
    with pytest.raises(
        ConfigError, match="evaluation.settings.heldout"
    ):  # training's evaluations steer: never on test data
        load_config(TrainRecipe, tiny, ["evaluation.settings.heldout=/data/test"])


def test_optimizer_offload_is_checked_and_told_to_deepspeed():
    """parallel.offload_optimizer: refused without a ZeRO partition to offload; DeepSpeed 0.19 runs it
    with PP (ZeRO-1) and every precision (tests/training/loop/test_trainer_multiproc.py trains it)."""
    from training.loop.ds_config import deepspeed_config

    tiny = REPO / "configs/train/bloom-tiny.yaml"
    with pytest.raises(ConfigError, match="parallel.offload_optimizer.*zero_stage 0 has none.*set zero_stage >= 1"):
        load_config(TrainRecipe, tiny, ["parallel.offload_optimizer=cpu", "parallel.zero_stage=0"])
    for ok in (["parallel.pp=2"], ["train.precision=fp32"], ["parallel.dp=2", "parallel.zero_stage=3"]):
        load_config(TrainRecipe, tiny, ["parallel.offload_optimizer=cpu", *ok])
    off = load_config(TrainRecipe, tiny, ["parallel.offload_optimizer=cpu"])
    assert deepspeed_config(off)["zero_optimization"] == {
        "stage": 1,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    }
    assert deepspeed_config(load_config(TrainRecipe, tiny))["zero_optimization"] == {"stage": 1}  # as before


def test_the_drill_switches_live_outside_the_recipe(monkeypatch):
    """BLOOMLINE_NAN_AT and BLOOMLINE_CPU_FP16 (training/config/drills.py) are read from the
    environment; a recipe saved while they were recipe keys still loads."""
    from bloomline.config import to_dict
    from training.checkpoint.meta import saved_recipe
    from training.config import drills

    assert drills.nan_at() == frozenset() and not drills.cpu_fp16()
    monkeypatch.setenv("BLOOMLINE_NAN_AT", "2, 5")
    assert drills.nan_at() == {2, 5}
    monkeypatch.setenv("BLOOMLINE_NAN_AT", "two")
    with pytest.raises(ConfigError, match="BLOOMLINE_NAN_AT.*expected step numbers"):
        drills.nan_at()
    old = to_dict(load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml"))
    old["train"].update(cpu_fp16=True, inject_nan_at=[3])
    assert to_dict(saved_recipe({"recipe": old}).train) == {
        k: v for k, v in old["train"].items() if k not in ("cpu_fp16", "inject_nan_at")
    }
