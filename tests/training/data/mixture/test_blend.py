"""The blend rules (training/data/mixture/blend.py) against hand-computed weights, and the fixed rules as the
trainer runs them (training/data/mixture/fixed.py): exact resume under every rule, the epochs per
language the sampler reports against what its stream positions imply, the decisions log."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bloomline.config import from_dict
from bloomline.errors import ConfigError, DataError
from tests.support.prepared import BATCH, write_prepared
from training.checkpoint.run_dir import RunDir
from training.config import BatchConfig, BlendRuleConfig
from training.data.mixture.blend import Blend, check_resume, temperature_at, unimax_budgets
from training.data.mixture.fixed import FixedMixture
from training.data.mixture.log import read_log
from training.data.sampler import DynamicBatchSampler, permutation_at, planned_tokens
from training.data.shard_reader import ShardIndex


def rule(**kw) -> BlendRuleConfig:
    return from_dict(BlendRuleConfig, kw, "batch.blend")


def test_unimax_spreads_the_budget_evenly_under_the_epoch_cap_as_the_paper_does():
    # ascending: a (10 tokens) takes min(600/3, 2·10) = 20, b min(580/2, 2·100) = 200, c what is left, 380
    got = unimax_budgets({"c": 1000, "a": 10, "b": 100}, budget=600, max_epochs=2)
    assert got == {"a": 20, "b": 200, "c": 380}
    # no cap binds: an equal share each
    assert unimax_budgets({"a": 1000, "b": 1000, "c": 5000}, budget=900, max_epochs=1) == {"a": 300, "b": 300, "c": 300}
    # as weights, against the same hand computation
    w = Blend(rule(rule="unimax", max_epochs=2), {"a": 10, "b": 100, "c": 1000}, {}, 600, 10).weights_for(1)
    assert w == pytest.approx({"a": 20 / 600, "b": 200 / 600, "c": 380 / 600})


def test_a_cap_the_data_cannot_meet_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as e:
        unimax_budgets({"a": 10, "b": 100, "c": 1000}, budget=10_000, max_epochs=2)
    assert e.value.key == "batch.blend.max_epochs"
    assert "2 epochs of every language hold 2,220 tokens, less than the run's budget of 10,000" in e.value.message
    assert "at least 9.01" in e.value.message
    with pytest.raises(ConfigError, match="unimax needs a cap"):
        rule(rule="unimax")


def test_the_schedule_moves_temperature_in_stages_and_weights_follow_it():
    cfg = rule(rule="schedule", temperature_start=2, temperature_end=1, schedule_steps=3, schedule_moves=1)
    # one move: two stages of ceil(3 / 2) = 2 steps, τ 2 for steps 1-2, then 1 from step 3 on
    assert [temperature_at(cfg, s, 10) for s in (1, 2, 3, 4, 9)] == [2, 2, 1, 1, 1]
    b = Blend(cfg, {"a": 1, "b": 9}, {}, 0, 10)
    assert b.weights_for(1) == pytest.approx({"a": 0.25, "b": 0.75})  # τ 2: sqrt(1) : sqrt(9)
    assert b.weights_for(3) == pytest.approx({"a": 0.1, "b": 0.9})  # τ 1: natural
    assert [s for s in range(1, 11) if b.moves_at(s)] == [3]
    # schedule_steps defaults to the run's steps; 100 moves asked, at most one a step: 4 here
    lin = Blend(rule(rule="schedule", temperature_start=5, temperature_end=1), {"a": 1, "b": 9}, {}, 0, 5)
    assert [temperature_at(lin.cfg, s, 5) for s in range(1, 6)] == [5, 4, 3, 2, 1]
    with pytest.raises(ConfigError, match="a schedule moves the weights itself"):
        from_dict(BatchConfig, {"mixture": "online", "blend": {"rule": "schedule"}}, "batch")


def test_alpha_natural_and_named_weights():
    tokens = {"en": 900, "code-python": 100}
    manifest = {"en": 0.6, "code-python": 0.4}
    assert Blend(rule(), tokens, manifest, 0, 1).weights_for(1) == manifest  # the manifest's, as prepared
    assert Blend(rule(alpha=0.5), tokens, {}, 0, 1).weights_for(1) == pytest.approx({"en": 0.75, "code-python": 0.25})
    assert Blend(rule(alpha=0), tokens, {}, 0, 1).weights_for(1) == pytest.approx({"en": 0.5, "code-python": 0.5})
    assert Blend(rule(rule="natural"), tokens, {}, 0, 1).weights_for(1) == pytest.approx(
        {"en": 0.9, "code-python": 0.1}
    )
    named = Blend(rule(rule="weights", weights={"en": 3, "py": 1}), tokens, {}, 0, 1)  # an alias of code-python
    assert named.weights_for(1) == {"en": 0.75, "code-python": 0.25}
    with pytest.raises(DataError, match=r"names \['sw'\], which have no training data"):
        Blend(rule(rule="weights", weights={"sw": 1}), tokens, {}, 0, 1)
    with pytest.raises(ConfigError, match="the weights rule needs weights"):
        rule(rule="weights")


def test_planned_tokens_bound_what_a_ramped_run_trains(index):
    batch = from_dict(
        BatchConfig,
        {
            "tokens_per_step": 16384,
            "micro_batch_tokens": 2048,
            "rampup_start_tokens": 4096,
            "rampup_increment_tokens": 4096,
            "rampup_tokens": 40_000,
        },
        "batch",
    )
    s = DynamicBatchSampler(index, batch, dp_size=1, seq_len=512, seed=1)
    trained = sum(s.next_step().tokens for _ in range(12))
    assert planned_tokens(BATCH, 12) == 12 * 16384
    # budgets 4096, 4096, ... as if each step trained all of its budget: at least what the steps trained
    assert trained <= planned_tokens(batch, 12) < 12 * 16384


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return ShardIndex(write_prepared(tmp_path_factory.mktemp("prepared")))


RULES = {
    "alpha": {"alpha": 0.3},
    "natural": {"rule": "natural"},
    "weights": {"rule": "weights", "weights": {"aa": 1, "bb": 0, "cc": 3}},
    "unimax": {"rule": "unimax", "max_epochs": 12},
    "schedule": {"rule": "schedule", "temperature_start": 10, "temperature_end": 1, "schedule_moves": 4},
}
STEPS = 20


def fixed_run(index, run_dir: Path, cfg: BlendRuleConfig, steps: range, state=None):
    """Steps ``steps`` as the trainer runs them: plan, step, the rule's move after it; (plans, sampler, blend)."""
    tokens = {lg: index.lang_tokens(lg) for lg in index.languages}
    blend = Blend(cfg, tokens, index.manifest["blend"], planned_tokens(BATCH, STEPS), STEPS)
    s = DynamicBatchSampler(index, BATCH, dp_size=2, seq_len=512, seed=5, blend=blend.weights_for(1))
    mix = FixedMixture(blend, RunDir(run_dir), s, rank=0)
    if state is None:
        mix.cut_log(-1)
        mix.start(0)
    else:
        s.load_state_dict(state)
        check_resume(blend.identity(), blend, s.step)
        mix.resume(None, s.step)
        mix.cut_log(s.step)
    plans = []
    for step in steps:
        plans.append(s.next_step())
        mix.after_step(step)
    return plans, s, blend


@pytest.mark.parametrize("name", RULES)
def test_a_resumed_run_draws_what_an_uninterrupted_one_does(index, tmp_path, name):
    cfg = rule(**RULES[name])
    whole, whole_sampler, blend = fixed_run(index, tmp_path / "whole", cfg, range(1, STEPS + 1))
    first, s, _ = fixed_run(index, tmp_path / "cut", cfg, range(1, 8))
    with open(tmp_path / "cut" / "mixture.jsonl", "a") as f:  # what the dead attempt logged after its checkpoint
        f.write(json.dumps({"step": 12, "weights": None}) + "\n")
    state = json.loads(json.dumps(s.state_dict()))
    rest, resumed, _ = fixed_run(index, tmp_path / "cut", cfg, range(8, STEPS + 1), state)
    assert first + rest == whole
    assert resumed.state_dict() == whole_sampler.state_dict()
    log = read_log(RunDir(tmp_path / "whole"))
    assert read_log(RunDir(tmp_path / "cut")) == log
    assert log[0]["step"] == 0 and log[0]["cause"]["rule"] == "start" and log[0]["weights"] == blend.weights_for(1)
    if name == "schedule":  # τ 10 → 1 in 4 moves, 5 stages of 4 steps: after steps 4, 8, 12, 16
        assert [e["step"] for e in log] == [0, 4, 8, 12, 16]
        causes = [log[0]["cause"]["blend"], *(e["cause"] for e in log[1:])]
        assert [c["temperature"] for c in causes] == [10, 7.75, 5.5, 3.25, 1]
        tail = [e["weights"]["cc"] for e in log]
        assert tail == sorted(tail, reverse=True)  # the smallest language is lifted less and less
    else:
        assert len(log) == 1
    if name == "weights":
        assert "bb" not in whole_sampler.weights and not whole_sampler.epochs().get("bb")


def test_epochs_per_language_are_what_the_stream_positions_imply(index, tmp_path):
    """The sampler's epochs (tokens drawn ÷ tokens) against a count from its state alone: every
    stream's full epochs, plus the lengths of the rows its current epoch's permutation has dealt."""
    _, s, _ = fixed_run(index, tmp_path, rule(**RULES["unimax"]), range(1, STEPS + 1))
    state = s.state_dict()
    drawn: dict[str, int] = {}
    for stream in s.streams:
        epoch, pos, size = state["streams"][stream.key]
        rows = permutation_at(np.arange(pos), size, s._key(stream, epoch))
        sids, local = stream.locate(rows)
        drawn[stream.lang] = drawn.get(stream.lang, 0) + epoch * stream.tokens + int(index.lengths(sids, local).sum())
    implied = {lg: n / index.lang_tokens(lg) for lg, n in drawn.items()}
    assert s.epochs() == pytest.approx(implied, rel=1e-12)
    assert max(implied.values()) > 1  # the small language wrapped into later epochs
    # under UniMax's cap (12 epochs of the planned budget) no language saw more than 12 passes
    assert max(implied.values()) <= 12 * 1.2 and math.isclose(sum(state["tokens_by_lang"].values()), s.consumed_tokens)


def test_a_resume_under_another_rule_is_refused(index, tmp_path):
    _, s, blend = fixed_run(index, tmp_path, rule(**RULES["natural"]), range(1, 3))
    other = Blend(rule(**RULES["unimax"]), {lg: index.lang_tokens(lg) for lg in index.languages}, {}, 10**6, STEPS)
    with pytest.raises(ConfigError, match=r'trained with \{"rule": "natural"\}.*resume it with the same rule'):
        check_resume(blend.identity(), other, 2)
