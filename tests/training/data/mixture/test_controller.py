"""The online mixture's update rules (training/data/mixture/controller.py) against hand-computed examples."""

import math

import numpy as np
import pytest

from bloomline.config import from_dict
from bloomline.errors import ConfigError
from training.data.mixture.controller import (
    MixtureController,
    OnlineMixtureConfig,
    ReferenceCurve,
    bandit_target,
    bound,
    exploration,
    progress,
)


def cfg(**kw):
    return from_dict(OnlineMixtureConfig, {"warmup_steps": 0, "min_weight": 0.0, "max_weight": 1.0, **kw})


def test_floors_and_ceilings_pin_languages_and_keep_the_others_ratios():
    # c·[.7, .2, .1] clipped to [.15, .6] sums to 1 at c = 1.25: the first at its ceiling, the last at its floor
    assert bound(np.array([0.7, 0.2, 0.1]), 0.15, 0.6) == pytest.approx([0.6, 0.25, 0.15])
    w = bound(np.array([0.9, 0.05, 0.03, 0.02]), 0.1, 0.5)
    assert w.sum() == pytest.approx(1) and w.min() >= 0.1 - 1e-12 and w.max() <= 0.5 + 1e-12
    assert bound(np.array([0.25, 0.25, 0.5]), 0.0, 1.0) == pytest.approx([0.25, 0.25, 0.5])  # inside: unchanged


def test_exp3_exploration_rate():
    assert exploration(1, 4) == pytest.approx(0.25)  # min(1/4, sqrt(ln 4 / 4) = 0.589)
    assert exploration(100, 4) == pytest.approx(math.sqrt(math.log(4) / 400))  # 0.0589
    assert exploration(5, 1) == 0.0


def test_bandit_target_is_exponential_weights_from_the_prior_mixed_with_uniform():
    # ∝ prior·e^reward: .5e², .25e³, .25e² → [.34976, .47537, .17488]; then (1 − 3·.05)·p + .05
    got = bandit_target(np.array([0.5, 0.25, 0.25]), np.array([2.0, 3.0, 2.0]), 1.0, 0.05)
    assert got == pytest.approx([0.34730, 0.45406, 0.19865], abs=1e-5)


def test_bandit_controller_smooths_rewards_and_keeps_unmeasured_ones():
    c = MixtureController(cfg(every=2, smoothing=1.0, explore=False), ["a", "b"], np.array([0.5, 0.5]))
    assert c.observe_losses(1, [4.0, 6.0], [2, 2]) is None  # not a boundary of `every`
    change = c.observe_losses(2, [2.0, 6.0], [2, 2])  # window means 6/4 = 1.5 and 12/4 = 3
    assert change.step == 2 and change.cause["rule"] == "bandit"
    assert c.weights == pytest.approx([1 / (1 + math.exp(1.5)), math.exp(1.5) / (1 + math.exp(1.5))])
    c.observe_losses(3, [2.0, 0.0], [1, 0])
    c.observe_losses(4, [2.0, 0.0], [1, 0])  # a: .5·1.5 + .5·2 = 1.75; b unmeasured: stays 3
    assert c.reward == pytest.approx([1.75, 3.0])
    assert c.weights[0] == pytest.approx(1 / (1 + math.exp(1.25)))


def test_the_floor_holds_and_smoothing_moves_part_way():
    c = MixtureController(cfg(every=1, smoothing=1.0, explore=False, min_weight=0.3), ["a", "b"], np.array([0.5, 0.5]))
    c.observe_losses(1, [1.5, 3.0], [1, 1])  # unbounded target [.18, .82]
    assert c.weights == pytest.approx([0.3, 0.7])
    c = MixtureController(cfg(every=1, smoothing=0.5, explore=False), ["a", "b"], np.array([0.5, 0.5]))
    c.observe_losses(1, [1.5, 3.0], [1, 1])
    assert c.weights[0] == pytest.approx(0.5 * 0.5 + 0.5 / (1 + math.exp(1.5)))


def test_warmup_waits_and_a_language_not_measured_yet_counts_as_average():
    c = MixtureController(cfg(every=1, warmup_steps=3), ["a", "b"], np.array([0.5, 0.5]))
    assert c.observe_losses(1, [1.0, 2.0], [1, 1]) is None and c.observe_losses(2, [1.0, 2.0], [1, 1]) is None
    c = MixtureController(cfg(every=1, explore=False, smoothing=1.0), ["a", "b", "c"], np.array([0.25, 0.25, 0.5]))
    assert c.observe_losses(1, [0.0, 0.0, 0.0], [0, 0, 0]) is None  # nothing measured: nothing to go by
    ch = c.observe_losses(2, [1.0, 0.0, 6.0], [1, 0, 2])  # b unmeasured: its reward is the mean of 1 and 3
    assert ch.cause["reward"] == {"a": 1.0, "b": None, "c": 3.0}
    z = np.array([math.log(0.25) - 1, math.log(0.25), math.log(0.5) + 1])  # η·(reward − mean 2)
    assert c.weights == pytest.approx(np.exp(z) / np.exp(z).sum())


def test_excess_over_a_reference_at_equal_tokens_seen():
    ref = ReferenceCurve("proxy", {"a": [(100, 2.0), (10_000, 1.0)], "b": [(100, 3.0), (10_000, 2.0)]})
    assert ref.at("a", 1000) == pytest.approx(1.5)  # halfway in log tokens
    assert ref.at("b", 50) == 3.0 and ref.at("b", 10**6) == 2.0  # outside: the nearest checkpoint
    c = MixtureController(cfg(rule="evaluation", smoothing=0.5), ["a", "b"], np.array([0.5, 0.5]), reference=ref)
    change = c.observe_results(7, 5, {"a": 1.8, "b": 2.9}, {"a": 1000, "b": 100})
    # excess: a 1.8 − 1.5 = .3, b 2.9 − 3.0 → 0; target softmax(log .5 + [.3, 0]) = [.57444, .42556]; half way
    assert change.cause["value"] == {"a": pytest.approx(0.3), "b": 0.0} and change.cause["checkpoint"] == 5
    assert c.weights == pytest.approx([0.53722, 0.46278], abs=1e-5)
    assert c.observe_results(8, 5, {"a": 1.0, "b": 1.0}, {"a": 2000, "b": 200}) is None  # already applied


def test_without_a_reference_each_language_is_steered_by_its_progress():
    assert progress(
        np.array([2.0, 3.0]), np.array([1.5, 2.9]), np.array([1000, 1000]), np.array([4000, 2000])
    ) == pytest.approx([0.25, 0.1])  # drop per doubling: .5 / 2, .1 / 1
    c = MixtureController(cfg(rule="evaluation", smoothing=1.0), ["a", "b"], np.array([0.5, 0.5]))
    first = c.observe_results(10, 10, {"a": 2.0, "b": 3.0}, {"a": 1000, "b": 1000})
    assert first.weights is None and "needs a second" in first.cause["held"]  # taken in, no change: needs two
    assert c.weights == pytest.approx([0.5, 0.5])
    c.observe_results(20, 20, {"a": 1.5, "b": 2.9}, {"a": 4000, "b": 2000})
    assert c.weights == pytest.approx([1 / (1 + math.exp(-0.15)), 1 / (1 + math.exp(0.15))])


def test_the_continuation_signal_steers_by_error_progress_and_leaves_an_unscored_language_alone():
    c = MixtureController(
        cfg(rule="evaluation", signal="continuation", smoothing=1.0), ["a", "b", "c"], np.full(3, 1 / 3)
    )
    # error rates (1 − acc); c was skipped by the task (too few windows): absent, then NaN
    c.observe_results(10, 10, {"a": 0.7, "b": 0.6}, {"a": 1000, "b": 1000, "c": 1000})
    change = c.observe_results(20, 20, {"a": 0.5, "b": 0.55, "c": math.nan}, {"a": 4000, "b": 2000, "c": 2000})
    # drop per doubling: a .2 / 2 = .1, b .05 / 1 = .05, c unmeasured → their mean .075 (no push
    # either way: 0 would starve it); target softmax(log 1/3 + [.1, .05, .075])
    assert change.cause["value"] == {"a": pytest.approx(0.1), "b": pytest.approx(0.05), "c": pytest.approx(0.075)}
    assert change.cause["signal"] == "continuation error progress per doubling of tokens seen"
    assert change.cause["unmeasured"] == ["c"]
    z = np.exp([0.1, 0.05, 0.075])
    assert c.weights == pytest.approx(z / z.sum())
    bpb = MixtureController(cfg(rule="evaluation", smoothing=1.0), ["a", "b"], np.full(2, 0.5))
    with pytest.raises(ConfigError, match="no bpb for \\['b'\\]"):  # bpb covers every language, always
        bpb.observe_results(10, 10, {"a": 2.0}, {"a": 1000, "b": 1000})


def test_a_checkpoint_steered_by_one_signal_resumes_with_that_signal_only():
    a = MixtureController(cfg(rule="evaluation", signal="continuation"), ["a", "b"], np.full(2, 0.5))
    b = MixtureController(cfg(rule="evaluation"), ["a", "b"], np.full(2, 0.5))
    with pytest.raises(ConfigError, match="batch.online.signal.*'continuation'"):
        b.load_state_dict(a.state_dict())
    old = b.state_dict()
    del old["signal"]  # written before the signal was a choice: bpb
    MixtureController(cfg(rule="evaluation"), ["a", "b"], np.full(2, 0.5)).load_state_dict(old)


def test_the_feedback_gives_the_continuation_error_of_the_languages_the_task_scored(tmp_path):
    from training.checkpoint.run_dir import RunDir
    from training.data.mixture.online import newest_feedback, read_feedback, signal_values, write_feedback

    # b scored over too few items to read (MIN_ITEMS): unmeasured
    write_feedback(tmp_path, 30, {"a": 1.5, "b": 2.0}, {"a": 10, "b": 5}, {"a": (0.75, 40), "b": (1.0, 3)})
    fb = read_feedback(newest_feedback(RunDir(tmp_path)))
    assert signal_values(fb, "continuation") == {"a": 0.25} and signal_values(fb, "bpb") == {"a": 1.5, "b": 2.0}
    v1 = {"version": 1, "step": 30, "bpb": {"a": 1.5}, "tokens_seen": {"a": 10}}  # before the field
    assert signal_values(v1, "continuation") == {}


def test_state_round_trip_continues_identically():
    a = MixtureController(cfg(every=1), ["a", "b", "c"], np.array([0.5, 0.3, 0.2]))
    rng = np.random.default_rng(0)
    feed = [(rng.uniform(1, 5, 3), rng.integers(0, 4, 3)) for _ in range(8)]
    for s, (l, t) in enumerate(feed[:4], 1):
        a.observe_losses(s, l, t)
    b = MixtureController(cfg(every=1), ["a", "b", "c"], np.array([0.5, 0.3, 0.2]))
    b.load_state_dict(a.state_dict())
    for s, (l, t) in enumerate(feed[4:], 5):
        a.observe_losses(s, l, t)
        b.observe_losses(s, l, t)
        assert (a.weights == b.weights).all()


def test_bad_configuration_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="batch.online.min_weight.*lower it to at most 0.1"):
        MixtureController(cfg(min_weight=0.2), [str(i) for i in range(10)], np.full(10, 0.1))
    with pytest.raises(ConfigError, match="batch.online.max_weight"):
        MixtureController(cfg(max_weight=0.05), [str(i) for i in range(10)], np.full(10, 0.1))
    with pytest.raises(ConfigError, match="rule"):
        cfg(rule="doremi")
    with pytest.raises(ConfigError, match="reference"):
        cfg(reference="/some/run")  # the bandit reads no reference
    with pytest.raises(ConfigError, match="signal"):
        cfg(signal="continuation")  # the bandit reads no evaluation
    with pytest.raises(ConfigError, match="signal"):
        cfg(rule="evaluation", signal="continuation", reference="/some/run")


def test_feedback_and_reference_files_round_trip(tmp_path):
    from training.checkpoint.run_dir import RunDir
    from training.data.mixture.online import (
        newest_feedback,
        read_feedback,
        read_reference,
        write_feedback,
        write_reference,
    )

    run = RunDir(tmp_path)
    assert newest_feedback(run) is None
    for step in (20, 100, 40):  # evaluations land in any order: the newest checkpoint's is the one to read
        write_feedback(tmp_path, step, {"a": 1.0 / step, "b": 2.0}, {"a": step * 10, "b": 5})
    assert newest_feedback(run).name == "step_00000100.json"
    assert read_feedback(newest_feedback(run)) == {
        "version": 2,
        "step": 100,
        "bpb": {"a": 0.01, "b": 2.0},
        "tokens_seen": {"a": 1000, "b": 5},
        "continuation": {},
        "continuation_n": {},
    }
    curve = ReferenceCurve("proxy", {"a": [(100, 2.0), (10_000, 1.0)]})
    write_reference(tmp_path, curve, {"languages": 1})
    assert read_reference(run) == curve
