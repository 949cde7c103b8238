"""BLOOM's multilingual tasks from local files (eval/tasks/lm_eval_local.py): the numbers equal
lm-eval's own run on ``bloomline export``'s folder, item for item, for every family in three
languages (one written without spaces); a hand-computed example; a missing language and a
malformed record are skipped with the reason while the rest runs."""

import json
from pathlib import Path

import pytest
import torch

from bloomline.config import load_config
from bloomline.task_spec import TaskSpec
from tests.support.checkpoints import one_rank_checkpoint
from tests.support.task_files import pieces, record, write
from training.config import EvalConfig, TrainRecipe
from training.model.bloom import Bloom

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow

LANGS = {
    "xstorycloze": ("en", "sw", "zh-Hans"),
    "xcopa": ("id", "sw", "zh-Hans"),
    "xnli": ("en", "sw", "zh-Hans"),
    "xwinograd": ("en", "fr", "zh-Hans"),
    "belebele": ("en", "sw", "zh-Hans"),
}


@pytest.fixture(scope="module")
def exported(demo_data, tmp_path_factory):
    """A 1-rank checkpoint of a bloom-tiny, exported (bloomline export) — and its model."""
    from training.hf.to_hf import export

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.zero_stage=0"])
    model = Bloom(r.model, seed=7).eval()
    step = one_rank_checkpoint(
        tmp_path_factory.mktemp("run") / "checkpoints" / "step_1", model.state_dict(), r, demo_data
    )
    return model, export(step, step.parent.parent / "hf")


def context(demo: Path, model: Bloom, spec: TaskSpec):
    import sentencepiece as spm

    from bloomline.tokenizer import token_bytes
    from eval.model import LocalModel
    from eval.tasks.base import Context
    from training.data.shard_reader import ShardIndex

    model_file = demo / "tokenizer" / "tokenizer.model"
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    return Context(
        model=LocalModel(model, torch.device("cpu")),
        tokenizer=sp,
        index=ShardIndex(demo, "valid"),
        token_bytes=token_bytes(model_file),
        tokenizer_file=model_file,
        eos_id=sp.eos_id(),
        settings=EvalConfig(),
        spec=spec,
    )


def test_every_family_equals_lm_evals_own_run_on_the_export_item_for_item(demo_data, exported, tmp_path):
    from eval.tasks import make
    from eval.tasks.lm_eval_local import export_lm_args, in_memory_lm, run_lm_eval
    from training.hf.to_hf import hf_model, hf_tokenizer

    model, hf_dir = exported
    names, ours = {}, {}
    for task, langs in LANGS.items():
        for lang in langs:
            write(tmp_path / task, lang, [record(task, pieces(demo_data, lang), k) for k in range(4)])
        spec = TaskSpec(name=task, data=str(tmp_path / task), langs=list(langs))
        t = make(spec)
        rows = t.run(context(demo_data, model, spec))
        ours[task] = {(r.lang, r.metric): (r.value, r.stderr, r.n) for r in rows if r.scope == "language"}
        assert {l for l, m in ours[task] if m == "acc"} == set(langs), rows
        names.update(
            {
                (task, l): n
                for l, n in t.write({l: tmp_path / task / f"{l}.jsonl" for l in langs}, tmp_path / "yaml").items()
            }
        )
    eos = json.loads((hf_dir / "config.json").read_text())["eos_token_id"]
    seq_len = model.cfg.seq_len
    theirs = run_lm_eval(
        "hf",
        list(names.values()),
        tmp_path / "yaml",
        None,
        model_args=export_lm_args(hf_dir, seq_len, eos),
        log_samples=True,
    )
    manifest = json.loads((demo_data / "manifest.json").read_text())
    lm = in_memory_lm(
        hf_model(model, manifest["tokenizer"]), hf_tokenizer(demo_data / "tokenizer" / "tokenizer.model"), seq_len, eos
    )
    mine = run_lm_eval(lm, list(names.values()), tmp_path / "yaml", None, log_samples=True)
    for (task, lang), name in names.items():
        res = theirs["results"][name]
        for m in ("acc", "acc_norm", "acc_bytes"):
            assert ours[task][lang, m] == (res[f"{m},none"], res[f"{m}_stderr,none"], 4), (task, lang, m)
        a = sorted(theirs["samples"][name], key=lambda s: s["doc_id"])
        b = sorted(mine["samples"][name], key=lambda s: s["doc_id"])
        assert len(a) == len(b) == 4
        for x, y in zip(a, b):  # the log-likelihood of every choice of every item, and the prompt it scored
            assert x["arguments"] == y["arguments"] and x["filtered_resps"] == y["filtered_resps"], (task, lang)
    spread = {
        round(float(r[0] if isinstance(r, (list, tuple)) else r), 3)
        for s in theirs["samples"].values()
        for x in s
        for r in x["filtered_resps"]
    }
    assert len(spread) > 20  # real, varied scores, not a constant
    # The parallel evaluator's lm-eval model (eval/tasks/lm_eval_model.py: HFLM's tokenizing and
    # metrics, log-probabilities of the continuation tokens from EvalModel.token_scores instead of
    # whole logits), here over the model in this process: every choice's log-likelihood within
    # 1e-4 and its greedy flag equal, item for item; accuracies identical. (The ranks' token_scores
    # equal this process's: tests/eval/parallel/test_ranks.py.)
    from transformers import BloomConfig

    from eval.model import LocalModel
    from eval.tasks.lm_eval_local import BATCH
    from eval.tasks.lm_eval_model import evalmodel_lm
    from training.hf.to_hf import hf_config

    conf = {k: v for k, v in hf_config(model.cfg, manifest["tokenizer"], "float32").items() if k != "architectures"}
    tokenizer = hf_tokenizer(demo_data / "tokenizer" / "tokenizer.model")
    lm = evalmodel_lm(LocalModel(model, torch.device("cpu")), BloomConfig(**conf), tokenizer, seq_len, eos, BATCH)
    via_scores = run_lm_eval(lm, list(names.values()), tmp_path / "yaml", None, log_samples=True)
    for name in names.values():
        for m in ("acc", "acc_norm", "acc_bytes"):
            assert via_scores["results"][name][f"{m},none"] == theirs["results"][name][f"{m},none"], (name, m)
        a = sorted(theirs["samples"][name], key=lambda s: s["doc_id"])
        b = sorted(via_scores["samples"][name], key=lambda s: s["doc_id"])
        for x, y in zip(a, b, strict=True):
            assert x["arguments"] == y["arguments"]
            for (ll_a, greedy_a), (ll_b, greedy_b) in ((r[0], q[0]) for r, q in zip(x["resps"], y["resps"])):
                assert ll_b == pytest.approx(ll_a, abs=1e-4) and greedy_a == greedy_b, name


@torch.no_grad()
def test_hand_computed_story_endings_a_missing_language_and_a_malformed_record(demo_data, exported, tmp_path):
    """The right ending of each story is set from log p(ending | story) computed here with the
    model itself, so acc is known: 2 of 3 (the third item's label is the other ending); per byte
    likewise. sw's file breaks at line 2 and ar has none: both skipped, the reason naming them."""
    import sentencepiece as spm
    import torch.nn.functional as F

    from eval.tasks import make

    model, _ = exported
    sp = spm.SentencePieceProcessor(model_file=str(demo_data / "tokenizer" / "tokenizer.model"))
    data = tmp_path / "xsc"
    expect = {}
    for lang in ("en", "zh-Hans"):
        recs, right_bytes = [], 0
        for k in range(3):
            rec = record("xstorycloze", pieces(demo_data, lang), k)
            story = " ".join(rec[f"input_sentence_{i}"] for i in range(1, 5))
            ll, per_byte = [], []
            for ending in (rec["sentence_quiz1"], rec["sentence_quiz2"]):
                ctx_ids = sp.encode(story)  # lm-eval: the continuation is what the whole adds to the context
                cont = sp.encode(story + " " + ending)[len(ctx_ids) :]
                logp = F.log_softmax(model(torch.tensor([ctx_ids + cont]))[0, :, : model.cfg.vocab_size].float(), -1)
                ll.append(sum(float(logp[len(ctx_ids) + i - 1, t]) for i, t in enumerate(cont)))
                per_byte.append(ll[-1] / len(ending.encode()))
            best = 0 if ll[0] > ll[1] else 1
            rec["answer_right_ending"] = 1 + (best if k < 2 else 1 - best)
            right_bytes += (0 if per_byte[0] > per_byte[1] else 1) == rec["answer_right_ending"] - 1
            recs.append(rec)
        write(data, lang, recs)
        expect[lang] = right_bytes / 3
    write(data, "es", [record("xstorycloze", pieces(demo_data, "es"), 0)])  # one item: lm-eval's stderr is "N/A"
    good = json.dumps(record("xstorycloze", pieces(demo_data, "sw"), 0))
    (data / "sw.jsonl").write_text(good + "\n" + good[:-9] + "\n" + good + "\n")
    spec = TaskSpec(name="xstorycloze", data=str(data), langs=["en", "zh-Hans", "sw", "ar", "es"])
    rows = {(r.lang, r.metric): r for r in make(spec).run(context(demo_data, model, spec)) if r.scope == "language"}
    for lang in ("en", "zh-Hans"):
        assert rows[lang, "acc"].value == pytest.approx(2 / 3) and rows[lang, "acc"].n == 3
        assert rows[lang, "acc_bytes"].value == pytest.approx(expect[lang])
    assert rows["sw", "skipped"].note.startswith(f"malformed record: {data / 'sw.jsonl'}:2: not a JSON record")
    assert rows["ar", "skipped"].note == f"no {data / 'ar.jsonl'}"
    assert not any(m != "skipped" for l, m in rows if l in ("sw", "ar"))
    assert rows["es", "acc"].n == 1 and rows["es", "acc"].stderr is None and rows["es", "acc"].value in (0.0, 1.0)
