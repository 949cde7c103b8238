"""The online mixture in real multi-process training (gloo, DeepSpeed, bloom-tiny on the demo
shards): every rank draws from the same weights at DP=2 and at PP=2, a resumed run replays the
uninterrupted one exactly (bandit, and the evaluation rule fed by real evaluation results that
land while it runs), and a missing evaluation never stalls it."""

import json
import shutil
import threading
from pathlib import Path

import pytest

from tests.support.train_runs import launch, metrics, ok
from training.checkpoint.meta import read_meta
from training.checkpoint.run_dir import RunDir
from training.data.mixture.log import read_log

pytestmark = pytest.mark.slow

BANDIT = [
    "batch.mixture=online",
    "batch.online.rule=bandit",
    "batch.online.every=1",
    "batch.online.warmup_steps=1",
    "batch.online.eta=4",
    "batch.online.smoothing=1",
    "batch.online.max_weight=0.9",
]


def drawn(out: Path) -> list[tuple]:
    """What each step drew and what it measured (batches: bucket, tokens per language; losses)."""
    return [
        (m["step"], m["bucket"], m["lang_tokens"], m["loss"], m["lang_loss"], m.get("mixture_weights"))
        for m in metrics(out)
    ]


def test_bandit_weights_move_alike_on_every_dp_rank_and_a_resume_replays_them(demo_data, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    ok(launch(demo_data, whole, [*BANDIT, "parallel.dp=2"]))
    log = read_log(RunDir(whole))
    assert [e["step"] for e in log] == [0, 1, 2, 3, 4] and log[0]["cause"]["rule"] == "start"
    assert all(e["cause"]["rule"] == "bandit" and e["inputs"] is None for e in log[1:])
    assert len({json.dumps(e["weights"]) for e in log}) == 5  # they moved at every step
    # the weights of the next step follow the step's measured losses (ranks would disagree and the
    # trainer's fingerprint check would stop the run if a rank used its own losses)
    m = metrics(whole)
    assert [r["mixture_weights"] for r in m] == [e["weights"] for e in log[1:]]  # decided after that step
    for r in m:  # a loss for exactly the languages the step drew, around the step's mean loss
        measured = {l: v for l, v in r["lang_loss"].items() if v is not None}
        assert set(measured) == {l for l, n in r["lang_tokens"].items() if n > 0}
        assert min(measured.values()) <= r["loss"] <= max(measured.values())
    assert read_meta(whole / "checkpoints" / "step_4")["mixture"]["weights"] == list(log[-1]["weights"].values())

    ok(launch(demo_data, cut, [*BANDIT, "parallel.dp=2", "train.steps=2"]))
    ok(launch(demo_data, cut, [*BANDIT, "parallel.dp=2"]))
    assert drawn(cut) == drawn(whole)
    assert read_log(RunDir(cut)) == log


def test_pp2_takes_the_language_losses_from_the_last_stage(demo_data, tmp_path):
    ok(launch(demo_data, tmp_path, [*BANDIT, "parallel.pp=2", "train.steps=3"]))
    for r in metrics(tmp_path):  # only the last stage computed losses: they reached every rank's row
        measured = {l: v for l, v in r["lang_loss"].items() if v is not None}
        assert set(measured) == {l for l, n in r["lang_tokens"].items() if n > 0}
        assert min(measured.values()) <= r["loss"] <= max(measured.values())
    log = read_log(RunDir(tmp_path))
    assert [e["step"] for e in log] == [0, 1, 2, 3]
    assert len({json.dumps(e["weights"]) for e in log}) == 4


EVALUATION = [
    "batch.mixture=online",
    "batch.online.rule=evaluation",
    "batch.online.warmup_steps=0",
    "batch.online.smoothing=1",
    "batch.online.eta=20",
    "train.steps=6",
    "checkpoint.keep=5",
]


@pytest.fixture(scope="module")
def feedback(demo_data, tmp_path_factory):
    """Real evaluations (eval/publish.py) of a real 4-step run's checkpoints 2 and 4: their feedback files."""
    from eval.publish import run_evaluation
    from training.config import EvalConfig

    run = tmp_path_factory.mktemp("evaluated")
    ok(launch(demo_data, run, []))
    for step in (2, 4):
        run_evaluation(run / "checkpoints" / f"step_{step}", demo_data, EvalConfig(prompts_per_lang=0, threads=1))
    files = sorted(RunDir(run).mixture_feedback.glob("step_*.json"))
    assert [f.name for f in files] == ["step_00000002.json", "step_00000004.json"]
    return files


def test_evaluation_decisions_are_replayed_on_resume_not_redecided_from_what_is_on_disk(demo_data, tmp_path, feedback):
    """The uninterrupted run takes checkpoint 2's evaluation at once and checkpoint 4's when it lands
    (after step 3 was logged, so at step 4 or later). A run resumed from its checkpoint 2, with both
    files on disk from the start, must take them at the same steps with the same numbers."""
    whole = tmp_path / "whole"
    fb = RunDir(whole).mixture_feedback
    fb.mkdir(parents=True)
    shutil.copy(feedback[0], fb)

    done = threading.Event()

    def land_late():
        while not done.is_set():
            if RunDir(whole).metrics.exists() and len(RunDir(whole).metrics.read_text().splitlines()) >= 3:
                shutil.copy(feedback[1], fb)
                return
            done.wait(0.05)

    t = threading.Thread(target=land_late, daemon=True)
    t.start()
    try:
        ok(launch(demo_data, whole, EVALUATION))
    finally:
        done.set()
        t.join()
    log = read_log(RunDir(whole))
    taken = [(e["step"], e["inputs"]["checkpoint"]) for e in log if e["inputs"]]
    assert taken[0] == (1, 2) and taken[1][1] == 4 and taken[1][0] >= 4, taken
    assert log[-1]["weights"] != log[0]["weights"]  # the second evaluation moved the weights (progress)
    assert "progress" in log[-1]["cause"]["signal"] and log[-1]["cause"]["since"] == 2

    # the job "died" after step 6, before its checkpoint: resume from step 2 with both results on disk
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    for step in (4, 6):
        shutil.rmtree(cut / "checkpoints" / f"step_{step}")
    (cut / "checkpoints" / "latest").write_text("step_2")
    ok(launch(demo_data, cut, EVALUATION))
    assert drawn(cut) == drawn(whole)
    assert read_log(RunDir(cut)) == log


def test_a_missing_evaluation_never_stalls_training(demo_data, tmp_path):
    """No evaluation ever lands (no watcher): every step runs, the weights stay the starting blend."""
    ok(launch(demo_data, tmp_path, [*EVALUATION, "train.steps=4"]))
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3, 4]
    assert [e["cause"]["rule"] for e in read_log(RunDir(tmp_path))] == ["start"]


def test_the_continuation_signal_reads_the_scored_languages_and_replays_on_resume(demo_data, tmp_path):
    """In process, one rank: the feedback row carries 1 − acc of the languages scored over enough
    items (NaN for the others), the decision records those as its inputs, and a resumed
    controller replays them at their step to the same weights, without reading the files."""
    import math

    import numpy as np

    from bloomline.config import from_dict
    from training.config import BatchConfig, OnlineMixtureConfig
    from training.data.mixture.online import OnlineMixture, write_feedback
    from training.data.sampler import DynamicBatchSampler
    from training.data.shard_reader import ShardIndex

    cfg = from_dict(OnlineMixtureConfig, {"rule": "evaluation", "signal": "continuation", "warmup_steps": 0})
    run = RunDir(tmp_path)

    def mixture() -> OnlineMixture:
        index = ShardIndex(demo_data, "train")
        sampler = DynamicBatchSampler(index, BatchConfig(tokens_per_step=8192, micro_batch_tokens=2048), 1, 512, 1)
        return OnlineMixture(cfg, run, sampler, rank=0)

    om = mixture()
    langs, k = om.languages, om.k
    om.start(0)
    seen = {l: 1000 for l in langs}
    # every language scored over 40 items but: the first over 3 (too few to read), the second not at all
    acc = {l: (0.25 + 0.01 * i, 40) for i, l in enumerate(langs[2:])} | {langs[0]: (0.9, 3)}
    write_feedback(tmp_path, 10, {l: 3.0 for l in langs}, seen, acc)
    row = om.row(11)
    assert row[0] == 10 and math.isnan(row[1]) and math.isnan(row[2])
    assert row[3:][: k - 2] == pytest.approx([1 - a for a, _ in list(acc.values())[: k - 2]])
    zeros = np.zeros(k)
    (held,) = om.after_step(11, zeros, zeros, np.array(row), measured=False)
    assert held.weights is None  # progress needs a second evaluation
    state = om.state_dict()
    better = {l: (a + 0.1 * (l != langs[-1]), n) for l, (a, n) in acc.items()}  # the last one did not improve
    write_feedback(tmp_path, 20, {l: 3.0 for l in langs}, {l: 2000 for l in langs}, better)
    (moved,) = om.after_step(21, zeros, zeros, np.array(om.row(21)), measured=False)
    assert moved.cause["unmeasured"] == langs[:2]
    w, w0 = moved.weights, read_log(run)[0]["weights"]
    up = {l: w[l] / w0[l] for l in langs}  # the unmeasured alike, between the one that stalled and those that learned
    assert up[langs[0]] == pytest.approx(up[langs[1]]) and up[langs[-1]] < up[langs[1]] < up[langs[2]]
    log = read_log(run)
    assert set(log[-1]["inputs"]["continuation_error"]) == set(langs[2:])  # the languages read, nothing else

    again = mixture()  # resumed from step 11: the later decision comes from the log, not from the files
    again.resume(state, 11)
    assert again.row(21)[0] == -1  # replaying: no file is read
    (replayed,) = again.after_step(21, zeros, zeros, np.array(again.row(21)), measured=False)
    assert replayed.weights == w

    write_feedback(tmp_path, 30, {l: 3.0 for l in langs}, seen, {})  # an evaluation without the task: unusable
    assert again.row(31)[0] == -1
