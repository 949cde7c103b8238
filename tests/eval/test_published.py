"""A published BLOOM evaluated as it is (``bloomline evaluate --model FOLDER --text …``,
eval/published.py): a tiny Hugging Face BLOOM made by the test, on text in three languages BLOOM
never saw, at tp=2 pp=2 through the command and in one process. Per language, bits per byte equal
transformers' forward on the same tokens, and xstorycloze equals ``lm_eval --model hf`` on the same
folder, in the one of them it has; what cannot be evaluated is one line."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.support.task_files import record, write

EXTRA = Path(__file__).resolve().parents[3] / "shared" / "corpus-extra" / "text"
LANGS = ["ko", "ru", "th"]
SCORED = ["ru"]  # the one of them lm-eval has an xstorycloze for


def pieces(text: str, lang: str, n: int = 36) -> list[str]:
    """Short pieces of ``text``: 5 words, or 12 characters in a language written without spaces."""
    if lang == "th":
        text = "".join(text.split())
        return [text[i * 12 :][:12] for i in range(n)]
    words = text.split()
    return [" ".join(words[i * 5 :][:5]) for i in range(n)]


@pytest.fixture(scope="module")
def evaluated(hf_bloom, tmp_path_factory):
    """``bloomline evaluate --model`` at tp=2 pp=2 on 5 documents of each language, with a local
    xstorycloze of 6 items per language made of other documents of it: (the results folder, the
    task's spec)."""
    from tests.support.cli import cli

    root = tmp_path_factory.mktemp("published")
    (root / "text").mkdir()
    for lang in LANGS:
        docs = (EXTRA / f"{lang}.jsonl").read_text(encoding="utf-8").splitlines()
        (root / "text" / f"{lang}.jsonl").write_text("\n".join(docs[:5]) + "\n", encoding="utf-8")
        other = " ".join(json.loads(d)["text"] for d in docs[5:9])
        write(root / "xsc", lang, [record("xstorycloze", pieces(other, lang), k) for k in range(6)])
    spec = {"name": "xstorycloze", "data": str(root / "xsc"), "langs": LANGS}
    over = ["parallel.tp=2", "parallel.pp=2", "precision=fp32", "prompts_per_lang=0", f"tasks=[{json.dumps(spec)}]"]
    res = cli(
        "evaluate", "--model", hf_bloom / "model", "--text", root / "text", "--out", root / "out",
        *[a for o in over for a in ("-o", o)],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "out", spec


def transformers_bpb(folder: Path, data: Path, lang: str) -> float:
    """Bits per byte of ``lang``'s evaluated text by BloomForCausalLM: each document of each
    validation sample run alone, every token after its first predicted (eval/RESULTS.md), its NLL
    over the tokens that stand for text divided by their bytes."""
    from transformers import AutoModelForCausalLM

    from bloomline.tokenizer import open_tokenizer
    from data_prep.storage.shards import tokenizer_file
    from training.data.shard_reader import ShardIndex

    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    index = ShardIndex(data, "valid")
    nbytes = torch.from_numpy(open_tokenizer(tokenizer_file(data, index.manifest)).token_bytes())
    nll = n = 0.0
    for (lg, _), stream in index.streams.items():
        if lg != lang:
            continue
        for sid, row in zip(*(a.tolist() for a in stream.locate(torch.arange(stream.size).numpy()))):
            toks, offsets = index.fetch(sid, row)
            bounds = [*offsets.tolist(), len(toks)]
            for a, b in zip(bounds, bounds[1:]):
                ids = torch.as_tensor(toks[a:b], dtype=torch.long)
                with torch.no_grad():
                    logp = torch.log_softmax(hf(ids[None]).logits[0, :-1].float(), -1)
                target = ids[1:]
                text = nbytes[target] > 0
                nll -= float(logp.gather(1, target[:, None])[:, 0][text].sum())
                n += int(nbytes[target].sum())
    return nll / (math.log(2) * n)


@pytest.mark.slow
def test_a_published_bloom_scores_as_transformers_and_lm_eval_score_it_at_any_layout(evaluated, hf_bloom):
    from bloomline.config import from_dict
    from bloomline.task_spec import TaskSpec
    from eval.publish import evaluate
    from eval.results.table import read_results
    from eval.tasks import make
    from eval.tasks.lm_eval_local import export_lm_args, run_lm_eval
    from training.config import EvalConfig

    out, spec = evaluated
    folder, data = hf_bloom / "model", out / "data"
    rows = read_results(out).to_pylist()
    assert {r["step"] for r in rows} == {0} and {r["layout"] for r in rows} == {"hf"}
    assert {r["eval_layout"] for r in rows} == {"tp=2 pp=2 device=cpu"}
    assert (out / "dashboard" / "index.html").is_file()

    def scores(rows: list[dict], task: str, metric: str) -> dict[str, float]:
        return {
            r["lang"]: r["value"]
            for r in rows
            if r["task"] == task and r["metric"] == metric and r["scope"] == "language"
        }

    parallel = scores(rows, "validation", "bpb")
    assert sorted(parallel) == LANGS
    for lang in LANGS:  # the reference: transformers, on the same tokens
        assert parallel[lang] == pytest.approx(transformers_bpb(folder, data, lang), rel=1e-5), lang
    cfg = from_dict(EvalConfig, {"precision": "fp32", "prompts_per_lang": 0, "tasks": [spec]})
    one = evaluate(folder, data, cfg, "one", logs=out / "logs").rows  # tp=1 pp=1, in this process
    assert scores(one, "validation", "bpb") == pytest.approx(parallel, rel=1e-6)
    assert {r["tokens_seen"] for r in one} == {0} and {r["epochs_seen"] for r in one} == {None}
    task = TaskSpec(**spec)
    names = make(task).write({l: Path(spec["data"]) / f"{l}.jsonl" for l in SCORED}, out / "yaml")
    eos = json.loads((data / "manifest.json").read_text())["tokenizer"]["eos_id"]
    theirs = run_lm_eval("hf", list(names.values()), out / "yaml", None, model_args=export_lm_args(folder, 2048, eos))
    want = {l: theirs["results"][names[l]]["acc,none"] for l in SCORED}
    assert scores(rows, "xstorycloze", "acc") == want == scores(one, "xstorycloze", "acc"), theirs["results"]
    skipped = {r["lang"]: r["note"] for r in rows if r["task"] == "xstorycloze" and r["metric"] == "skipped"}
    assert sorted(skipped) == ["ko", "th"] and "lm-eval has no xstorycloze prompt for 'ko'" in skipped["ko"]


@pytest.mark.slow
def test_another_architecture_runs_in_one_process_as_transformers_and_lm_eval_run_it(evaluated, hf_bloom, tmp_path):
    """A GPT-2 (transformers' own class, made here with the BLOOM folder's tokenizer) on the same
    text: bits per byte per language as transformers' forward, xstorycloze as ``lm_eval --model hf``,
    greedy generations as transformers' ``generate``; a tp·pp layout is refused in one line."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    from bloomline.config import from_dict
    from bloomline.errors import ConfigError
    from bloomline.task_spec import TaskSpec
    from eval.generate import generate
    from eval.model import TransformersModel
    from eval.publish import evaluate
    from eval.published import OtherModel, other_model
    from eval.tasks import make
    from eval.tasks.lm_eval_local import export_lm_args, run_lm_eval
    from training.config import EvalConfig

    out, spec = evaluated
    data, folder = out / "data", tmp_path / "gpt2"
    tok = json.loads((data / "manifest.json").read_text())["tokenizer"]
    torch.manual_seed(0)
    conf = GPT2Config(vocab_size=tok["vocab_size"], n_positions=2048, n_embd=64, n_layer=2, n_head=4)
    GPT2LMHeadModel(conf).save_pretrained(folder)
    for f in (hf_bloom / "model").glob("tokenizer*"):
        shutil.copy(f, folder / f.name)
    cfg = {"precision": "fp32", "prompts_per_lang": 1, "new_tokens": 5, "tasks": [spec]}
    ev = evaluate(folder, data, from_dict(EvalConfig, cfg), "gpt2", logs=tmp_path / "logs")
    bpb = {r["lang"]: r["value"] for r in ev.rows if r["metric"] == "bpb" and r["scope"] == "language"}
    assert sorted(bpb) == LANGS and {r["layout"] for r in ev.rows} == {"hf"}
    for lang in LANGS:
        assert bpb[lang] == pytest.approx(transformers_bpb(folder, data, lang), rel=1e-5), lang
    names = make(TaskSpec(**spec)).write({l: Path(spec["data"]) / f"{l}.jsonl" for l in SCORED}, tmp_path / "yaml")
    theirs = run_lm_eval(
        "hf", list(names.values()), tmp_path / "yaml", None, model_args=export_lm_args(folder, 2048, tok["eos_id"])
    )
    ours = {
        r["lang"]: r["value"]
        for r in ev.rows
        if r["task"] == "xstorycloze" and r["metric"] == "acc" and r["scope"] == "language"
    }
    assert ours == {l: theirs["results"][names[l]]["acc,none"] for l in SCORED}
    assert len(ev.generations) == len(LANGS)
    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    prompts, eos = [[5, 17, 300, 42, 7, 7], [9, 8]], tok["eos_id"]  # of two lengths: the shorter left-padded
    ours = generate(
        TransformersModel(
            hf, other_model({"other": vars(OtherModel("gpt2", conf.vocab_size, 2048))}), torch.device("cpu")
        ),
        prompts,
        6,
        eos,
    )
    for p, got in zip(prompts, ours):
        want = hf.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, eos_token_id=eos, pad_token_id=eos)[
            0, len(p) :
        ].tolist()
        assert got == want[: want.index(eos)] if eos in want else got == want, (p, got, want)
    with pytest.raises(ConfigError, match="a 'gpt2' model is evaluated in one process"):
        evaluate(folder, data, from_dict(EvalConfig, {**cfg, "parallel": {"tp": 2}}), "gpt2", logs=tmp_path / "logs")


def test_what_cannot_be_evaluated_is_one_line(hf_bloom, demo_data, tmp_path):
    """Refused before anything is prepared or started (in this process)."""
    from flows.cli.app import app

    (tmp_path / "text.jsonl").write_text(json.dumps({"id": "1", "text": "Merhaba dünya", "lang": "tr"}) + "\n")
    bare = tmp_path / "bare"  # a model folder without its tokenizer
    bare.mkdir()
    for f in (hf_bloom / "model").iterdir():
        if not f.name.startswith("tokenizer"):
            shutil.copy(f, bare / f.name)
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    shutil.copy(hf_bloom / "model" / "tokenizer.json", gpt / "tokenizer.json")
    model, text, out = str(hf_bloom / "model"), str(tmp_path / "text.jsonl"), str(tmp_path / "out")
    for args, says in [
        (["--model", model, "--text", text], "--model needs --out"),
        (["--model", model, "--out", out], "--model needs --text (the text to evaluate on) or --data"),
        (["--model", model, "--checkpoint", model, "--data", text], "give --checkpoint (a bloomline checkpoint) or"),
        (["--checkpoint", model, "--text", text, "--data", text], "--text needs --out"),
        (["--model", str(bare), "--text", text, "--out", out], "has no tokenizer.json"),
        (
            ["--model", str(gpt), "--text", text, "--out", out, "-o", "parallel.pp=2"],
            "'gpt2' model is evaluated in one",
        ),
        (["--model", str(tmp_path), "--text", text, "--out", out], "is not a Hugging Face model folder (config.json)"),
        (["--model", model, "--data", str(demo_data), "--out", out], "tokenized with another tokenizer than"),
        (["--model", model, "--text", text, "--out", out, "-o", "parallel.tp=3"], "parallel.tp"),
    ]:
        res = CliRunner().invoke(app, ["evaluate", *args])
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and says in lines[0], (args, res.stderr)
    assert not (tmp_path / "out").exists()
