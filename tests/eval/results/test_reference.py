"""A reference run for the evaluation-driven mixture is read from its results table and refused,
with one line naming the mismatch, when its languages, tokenizer or validation data differ."""

import json
import shutil
from pathlib import Path

import pytest

from bloomline.errors import ConfigError
from eval.results.reference import reference_curve
from tests.support.eval_runs import make_run
from training.checkpoint.run_dir import RunDir
from training.data.shard_reader import ShardIndex, verify_once

pytestmark = pytest.mark.slow


@pytest.fixture
def ref(demo_data, tmp_path):
    run = tmp_path / "proxy"
    make_run(run, demo_data)
    verify_once(ShardIndex(demo_data, "valid"), RunDir(run).eval_stamp)  # what its evaluations checked
    return run


def languages(run: Path) -> list[str]:
    from eval.results.table import read_results

    return sorted({r["lang"] for r in read_results(run).to_pylist() if r["scope"] == "language"})


def test_a_comparable_reference_gives_each_languages_bpb_at_its_tokens_seen(ref, demo_data):
    curve, checked = reference_curve(ref, demo_data, languages(ref))
    assert curve.run == "proxy" and checked["evaluations"] == 3 and checked["languages"] == len(languages(ref))
    assert curve.points["sw"] == [
        (1000, pytest.approx(0.9 * 900 / (1200 * 0.6931471805599453), rel=1e-9)),
        (2000, pytest.approx(0.8 * 900 / (1200 * 0.6931471805599453), rel=1e-9)),
        (3000, pytest.approx(0.7 * 900 * 1.3 / (1200 * 0.6931471805599453), rel=1e-9)),
    ]


def test_other_languages_another_tokenizer_or_other_validation_data_are_refused(ref, demo_data, tmp_path):
    langs = languages(ref)
    with pytest.raises(ConfigError, match=r"other languages than this run; only the reference: \['sw'\]") as e:
        reference_curve(ref, demo_data, [l for l in langs if l != "sw"])
    assert e.value.key == "batch.online.reference"

    other = tmp_path / "retokenized"  # the reference trained on data with another tokenizer
    shutil.copytree(demo_data, other)
    m = json.loads((other / "manifest.json").read_text())
    m["tokenizer"]["sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(m))
    meta_file = ref / "checkpoints" / "step_300" / "bloomline.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "data_dir": str(other)}))
    with pytest.raises(ConfigError, match=r"used another tokenizer \(sha256 000000000000…"):
        reference_curve(ref, demo_data, langs)
    meta_file.write_text(json.dumps(meta))

    stamp = json.loads(RunDir(ref).eval_stamp.read_text())  # validated on another sample of one language
    path = sorted(stamp["shards"])[0]
    stamp["shards"][path][2] = "f" * 64
    RunDir(ref).eval_stamp.write_text(json.dumps(stamp))
    with pytest.raises(ConfigError, match=rf"was validated on other data than .*: validation shard {path} differs$"):
        reference_curve(ref, demo_data, langs)
