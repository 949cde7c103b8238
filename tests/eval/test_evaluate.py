"""Per-language metrics and the results store (contract 3), on the demo data's validation splits."""

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bloomline.config import load_config
from bloomline.io import TMP_MARK
from eval.evaluate import generations
from eval.model import LocalModel
from eval.results.metrics import LangTotals, metric_rows, regressions
from eval.results.rows import long_rows, validation_rows
from eval.results.table import (
    SCHEMA,
    ResultsError,
    clear_evaluations,
    copy_evaluations,
    evaluated_steps,
    read_results,
    record_skipped,
    skipped_steps,
    write_results,
)
from eval.tasks.validation import evaluate_model, language_samples
from flows.stages.evaluate import artifact_key
from training.config import EvalConfig, ModelConfig
from training.data.shard_reader import ShardIndex
from training.model.bloom import Bloom

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def demo(demo_data):
    return demo_data  # prepared once per session (tests/conftest.py)


def test_bits_per_byte_of_a_uniform_model_is_log2_vocab_over_bytes_per_token(demo):
    """A model whose output is uniform over the 4,000 real tokens: every predicted token costs
    ln 4000 nats, so loss = ln 4000 and bits per byte = (text tokens · log2 4000) / bytes, with the
    bytes counted here independently, by decoding the evaluated documents with SentencePiece
    (unknown tokens stand for no known text: dropped before decoding, as RESULTS.md says)."""
    import sentencepiece as spm

    cfg = load_config(ModelConfig, REPO / "configs/model/bloom-tiny.yaml")
    model = Bloom(cfg, seed=1).eval()
    with torch.no_grad():  # final LayerNorm to zero: hidden 0, every real logit 0
        model.final_ln.weight.zero_()
        model.final_ln.bias.zero_()
    index = ShardIndex(demo, "valid")
    sp = spm.SentencePieceProcessor(model_file=str(demo / "tokenizer" / "tokenizer.model"))
    from bloomline.tokenizer import token_bytes

    got = evaluate_model(
        LocalModel(model, CPU), index, EvalConfig(), token_bytes(demo / "tokenizer" / "tokenizer.model"), sp.eos_id()
    )
    assert set(got) == set(index.languages) and len(got) > 50
    whole = cut = 0
    for lang, t in got.items():
        text_tokens = n_bytes = docs = 0
        for _, refs in language_samples(index, lang, None):
            for sid, row in refs:
                toks, offsets = index.fetch(sid, row)
                bounds = [*offsets.tolist(), len(toks)]
                for a, b in zip(bounds, bounds[1:]):
                    seg = [int(x) for x in toks[a:b] if x != sp.eos_id()]
                    docs += int(toks[b - 1] == sp.eos_id())
                    if len(seg) < 2:  # the segment's first token is not predicted
                        continue
                    assert seg[0] != sp.unk_id()
                    rest = [x for x in seg[1:] if x != sp.unk_id()]
                    text_tokens += len(rest)
                    if not (sp.is_byte(seg[0]) or sp.is_byte(seg[-1])):
                        whole += 1  # starts and ends on whole characters: SentencePiece's text, minus the first token's
                        n_bytes += len(sp.decode(seg[:1] + rest).encode()) - len(sp.decode(seg[:1]).encode())
                    else:
                        cut += 1  # a document piece cut inside a character (byte fallback): count its bytes one by one
                        n_bytes += sum(
                            1 if sp.is_byte(x) else len(sp.id_to_piece(x).replace("\u2581", " ").encode()) for x in rest
                        )
        assert t.loss == pytest.approx(math.log(4000), rel=1e-6), lang
        assert t.bytes == n_bytes and t.docs == docs, lang
        assert t.bpb == pytest.approx(text_tokens * math.log2(4000) / n_bytes, rel=1e-6), lang
    assert whole > 4 * cut, (whole, cut)  # most segments are checked against SentencePiece's own decoding


def test_aggregates_token_weighted_and_language_mean():
    a = LangTotals(nll=100.0, tokens=50, text_nll=90.0, bytes=200, docs=2)  # sw: niger-congo
    b = LangTotals(nll=30.0, tokens=10, text_nll=30.0, bytes=20, docs=1)  # yo: niger-congo
    c = LangTotals(nll=20.0, tokens=10, text_nll=20.0, bytes=40, docs=1)  # en: other
    rows = metric_rows({"sw": a, "yo": b, "en": c}, {"sw": 1000, "en": 5})
    by = {(r["scope"], r["lang"], r["weighting"]): r for r in rows}
    nc_tok, nc_mean = by[("group", "niger-congo", "tokens")], by[("group", "niger-congo", "mean")]
    assert nc_tok["loss"] == pytest.approx(130 / 60) and nc_tok["bpb"] == pytest.approx(120 / (math.log(2) * 220))
    assert nc_mean["bpb"] == pytest.approx((90 / (math.log(2) * 200) + 30 / (math.log(2) * 20)) / 2)
    assert nc_tok["tokens"] == 60 and nc_tok["docs"] == 3 and nc_tok["tokens_seen"] == 1000
    assert by[("overall", "all", "tokens")]["bytes"] == 260 and ("group", "code", "tokens") not in by
    assert (
        by[("language", "yo", "tokens")]["family"] == "niger-congo"
        and by[("language", "yo", "tokens")]["tokens_seen"] == 0
    )


def test_greedy_generations_come_from_fixed_prompts(demo):
    import sentencepiece as spm

    cfg = load_config(ModelConfig, REPO / "configs/model/bloom-tiny.yaml")
    model = LocalModel(Bloom(cfg, seed=1), CPU)
    index = ShardIndex(demo, "valid")
    sp = spm.SentencePieceProcessor(model_file=str(demo / "tokenizer" / "tokenizer.model"))
    ec = EvalConfig(prompts_per_lang=1, prompt_tokens=8, new_tokens=4)
    a, b = (generations(model, index, ec, sp.decode, sp.eos_id()) for _ in range(2))
    assert a == b and {g["lang"] for g in a} <= set(index.languages) and len(a) > 40
    assert all(g["prompt"] and g["k"] == 0 for g in a)


def rows_for(step, bpb):
    from datetime import datetime, timezone

    base = {
        "run": "r",
        "checkpoint": f"/r/checkpoints/step_{step}",
        "precision": "fp32",
        "layout": "tp=1 pp=1 dp=1 zero_stage=1",
        "data_manifest_sha256": "a" * 64,
        "evaluated_at": datetime.now(timezone.utc),
        "step": step,
    }
    return long_rows(
        [
            {**base, **r}
            for r in metric_rows({"en": LangTotals(nll=10, tokens=10, text_nll=bpb * math.log(2) * 10, bytes=10)}, {})
        ]
    )


def test_results_store_replaces_a_checkpoints_rows_and_refuses_foreign_files(tmp_path):
    write_results(tmp_path, 10, rows_for(10, 1.0), [])
    write_results(tmp_path, 20, rows_for(20, 1.1), [])
    (tmp_path / "eval" / "results" / f"step_00000020.parquet{TMP_MARK}4242").write_bytes(b"half")  # a killed evaluation
    write_results(tmp_path, 20, rows_for(20, 1.2), [])  # re-evaluated: replaces, no duplicates
    t = read_results(tmp_path)
    assert evaluated_steps(tmp_path) == [10, 20] and t.num_rows == 2 * len(rows_for(10, 1.0))
    en20 = [r for r in validation_rows(t) if r["step"] == 20 and r["scope"] == "language"]
    assert len(en20) == 1 and en20[0]["bpb"] == pytest.approx(1.2)
    assert not list((tmp_path / "eval" / "results").glob("*.tmp-*"))
    # plain pyarrow reads the folder as a dataset
    import pyarrow.dataset as ds

    assert ds.dataset(tmp_path / "eval" / "results", format="parquet").count_rows() == t.num_rows
    pq.write_table(pa.table({"step": [30], "loss": [1.0]}), tmp_path / "eval" / "results" / "step_00000030.parquet")
    with pytest.raises(ResultsError, match="step_00000030.parquet: results version missing"):
        read_results(tmp_path)
    bad = pa.table({"step": [30]}).replace_schema_metadata({b"bloomline.results_version": b"1"})
    pq.write_table(bad, tmp_path / "eval" / "results" / "step_00000030.parquet")
    with pytest.raises(ResultsError, match="not the results schema"):
        read_results(tmp_path)


def test_a_runs_evaluations_are_copied_and_restored_whole(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_results(a, 10, rows_for(10, 1.0), [])
    write_results(a, 20, rows_for(20, 1.1), [])
    record_skipped(a, 15, "deleted by checkpoint.keep")
    write_results(b, 30, rows_for(30, 2.0), [])  # other settings' results: replaced, not mixed in
    copy_evaluations(a, b)
    assert evaluated_steps(b) == [10, 20] and skipped_steps(b) == {15: "deleted by checkpoint.keep"}
    assert read_results(b).equals(read_results(a))
    clear_evaluations(b)
    assert evaluated_steps(b) == [] and skipped_steps(b) == {} and evaluated_steps(a) == [10, 20]


def test_regressions_and_artifact_keys():
    def wide(step, bpb):
        return validation_rows(pa.Table.from_pylist(rows_for(step, bpb), schema=SCHEMA))

    before = {r["lang"]: r for r in wide(10, 1.0) if r["scope"] == "language"}
    assert regressions(wide(20, 1.01), before, 0.02) == []
    (g,) = regressions(wide(20, 1.05), before, 0.02)
    assert g["lang"] == "en" and g["change"] == pytest.approx(0.05) and g["previous_step"] == 10
    assert artifact_key("evaluation", "My Run_zh-Hans") == "evaluation-my-run-zh-hans"


def test_hf_names_cover_blooms_parameters_and_the_tokenizer_is_exact(demo, tmp_path):
    """Every Bloom parameter maps to a BloomForCausalLM parameter of the same shape (the tied
    lm_head aside); the exported tokenizer gives SentencePiece's ids on every document of the
    sample corpus (validation documents included)."""
    import json as _json

    import sentencepiece as spm
    from transformers import AutoTokenizer, BloomConfig, BloomForCausalLM

    from training.hf.to_hf import hf_config, hf_name, save_tokenizer

    cfg = load_config(ModelConfig, REPO / "configs/model/bloom-tiny.yaml")
    ours = Bloom(cfg)
    tok = _json.loads((demo / "manifest.json").read_text())["tokenizer"]
    hf = BloomForCausalLM(
        BloomConfig(
            **{
                k: v
                for k, v in hf_config(cfg, tok, "float32").items()
                if k not in ("architectures", "model_type", "torch_dtype")
            }
        )
    )
    theirs = {n: p.shape for n, p in hf.named_parameters()}
    mapped = {hf_name(n): p.shape for n, p in ours.named_parameters()}
    assert set(mapped) == set(theirs)
    assert all(mapped[n] == theirs[n] for n in mapped if "word_embeddings.weight" not in n)
    assert theirs["transformer.word_embeddings.weight"][0] == cfg.vocab_size  # padding rows dropped
    model_file = demo / "tokenizer" / "tokenizer.model"
    save_tokenizer(model_file, tmp_path)
    t = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    docs = [
        _json.loads(l)["text"]
        for f in sorted((REPO / "data_prep/sample_corpus").rglob("*.jsonl"))
        for l in f.read_text().splitlines()
        if l.strip()
    ]
    assert len(docs) > 400
    assert all(t(d, add_special_tokens=False)["input_ids"] == sp.encode(d) for d in docs)


def test_a_resumed_run_withdraws_the_evaluations_of_the_future_it_redoes(tmp_path):
    """Results, generations, skipped records and the mixture's feedback files of checkpoints after
    the step a run resumes from are withdrawn; the ones up to it stay."""
    from eval.publish import retract_after
    from training.checkpoint.run_dir import RunDir
    from training.data.mixture.online import newest_feedback, write_feedback

    for step in (10, 20, 30):
        write_results(tmp_path, step, rows_for(step, 1.0), [])
        write_feedback(tmp_path, step, {"en": 1.0}, {"en": step})
    record_skipped(tmp_path, 15, "its evaluation failed")
    record_skipped(tmp_path, 40, "deleted by checkpoint.keep")
    assert retract_after(tmp_path, 20) == [30, 40]
    assert evaluated_steps(tmp_path) == [10, 20] and skipped_steps(tmp_path) == {15: "its evaluation failed"}
    assert sorted(p.name for p in (tmp_path / "eval" / "generations").iterdir()) == [
        "step_00000010.parquet",
        "step_00000020.parquet",
    ]
    assert newest_feedback(RunDir(tmp_path)).name == "step_00000020.json"
    assert retract_after(tmp_path, 20) == []


def test_version_1_results_are_still_read_in_the_long_form(tmp_path):
    """A version-1 file (one wide row per language or aggregate) reads as version 2's long rows of
    the validation task, and its validation view has the numbers it was written with."""
    from eval.results.table import SCHEMA_V1

    wide = validation_rows(pa.Table.from_pylist(rows_for(10, 1.25), schema=SCHEMA))
    folder = tmp_path / "eval" / "results"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(wide, schema=SCHEMA_V1), folder / "step_00000010.parquet")
    write_results(tmp_path, 20, rows_for(20, 1.5), [])  # a version-2 file beside it
    t = read_results(tmp_path)
    assert t.schema.equals(SCHEMA) and set(t.column("task").to_pylist()) == {"validation"}
    got = {(r["step"], r["scope"], r["lang"], r["weighting"]): r["bpb"] for r in validation_rows(t)}
    assert got[(10, "language", "en", "tokens")] == pytest.approx(1.25) and got[
        (20, "language", "en", "tokens")
    ] == pytest.approx(1.5)
    assert len(got) == 2 * len(wide)
    assert {r["eval_layout"] for r in t.to_pylist() if r["step"] == 10} == {"tp=1 pp=1 device=cpu"}


def test_version_2_results_read_with_a_null_epochs_seen(tmp_path):
    from eval.results.table import SCHEMA_V2

    rows = [{k: v for k, v in r.items() if k != "epochs_seen"} for r in rows_for(10, 1.25)]
    folder = tmp_path / "eval" / "results"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA_V2), folder / "step_00000010.parquet")
    write_results(tmp_path, 20, [{**r, "epochs_seen": 2.5} for r in rows_for(20, 1.5)], [])
    t = read_results(tmp_path)
    assert t.schema.equals(SCHEMA)
    by_step = {s: {r["epochs_seen"] for r in t.to_pylist() if r["step"] == s} for s in (10, 20)}
    assert by_step == {10: {None}, 20: {2.5}}
    assert {r["eval_layout"] for r in t.to_pylist() if r["step"] == 10} == {"tp=1 pp=1 device=cpu"}


def test_version_3_results_read_as_evaluated_in_one_process_on_the_cpu(tmp_path):
    """Every evaluation before version 4 ran in one process on the CPU: a version-3 file's rows get
    that ``eval_layout``; a version-4 file's keep their own."""
    from eval.results.table import SCHEMA_V3

    folder = tmp_path / "eval" / "results"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows_for(10, 1.25), schema=SCHEMA_V3), folder / "step_00000010.parquet")
    assert pq.read_schema(folder / "step_00000010.parquet").metadata[b"bloomline.results_version"] == b"3"
    write_results(tmp_path, 20, [{**r, "eval_layout": "tp=2 pp=2 device=cuda"} for r in rows_for(20, 1.5)], [])
    t = read_results(tmp_path)
    assert t.schema.equals(SCHEMA)
    by_step = {s: {r["eval_layout"] for r in t.to_pylist() if r["step"] == s} for s in (10, 20)}
    assert by_step == {10: {"tp=1 pp=1 device=cpu"}, 20: {"tp=2 pp=2 device=cuda"}}
    (en,) = [r for r in validation_rows(t) if r["step"] == 10 and r["lang"] == "en"]
    assert en["bpb"] == pytest.approx(1.25)  # the rest of the row as written


def test_every_results_column_is_documented():
    from eval.results.table import SCHEMA

    doc = (REPO / "eval" / "RESULTS.md").read_text()
    assert [c for c in SCHEMA.names if f"| `{c}` |" not in doc] == []


def test_an_unknown_task_or_one_without_its_data_is_refused_naming_the_key():
    from bloomline.errors import ConfigError
    from bloomline.task_spec import TaskSpec
    from eval.tasks import check

    with pytest.raises(ConfigError, match=r"tasks.*unknown task 'xstory' \(known: belebele, continuation, flores, "):
        check([TaskSpec(name="xstory")])
    check([TaskSpec(name="continuation")])
    with pytest.raises(ConfigError, match=r"task 'xstorycloze' reads its items from a data folder: give it data: DIR"):
        check([TaskSpec(name="xstorycloze")])
    with pytest.raises(ConfigError, match=r"task 'flores': data folder /nowhere/flores does not exist"):
        check([TaskSpec(name="flores", data="/nowhere/flores")])


def test_held_out_data_is_evaluated_only_with_the_training_datas_tokenizer(demo, tmp_path):
    import json
    import shutil

    from bloomline.errors import ConfigError
    from eval.evaluate import heldout_data

    assert heldout_data(demo, EvalConfig()) == demo
    same = tmp_path / "same"
    shutil.copytree(demo, same)
    assert heldout_data(demo, EvalConfig(heldout=str(same))) == same
    m = json.loads((same / "manifest.json").read_text())
    m["tokenizer"]["sha256"] = "0" * 64  # prepared with a tokenizer of its own
    (same / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match="'heldout'.*another tokenizer.*tokenizer.model="):
        heldout_data(demo, EvalConfig(heldout=str(same)))
    from eval.publish import run_evaluation

    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    for out in (None, tmp_path / "run"):  # never into the run's own results
        with pytest.raises(ConfigError, match="'heldout'.*give --out"):
            run_evaluation(ckpt, demo, EvalConfig(heldout=str(same)), out)
