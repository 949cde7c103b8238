"""Starting from an existing Hugging Face BLOOM (training/hf/from_hf.py): its shape and
tokenizer checked before any rank starts, in one line; in fp32 the first step's loss is
transformers' loss on the same batch, at TP1 with ZeRO-3 over two ranks and at TP2 x PP2; after
steps too small to move a weight, the export is the original, tensor for tensor."""

import json
from pathlib import Path

import pytest
import torch

from bloomline.config import load_config
from bloomline.errors import CheckpointError, ConfigError
from tests.support.train_runs import launch, metrics, ok
from training.config import TrainRecipe
from training.hf.from_hf import check_init_from, init_weights, open_source
from training.parallel.layout import EMBEDDING

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs/train/bloom-tiny.yaml"


def tokenizer_of(data: Path) -> dict:
    return json.loads((data / "manifest.json").read_text())["tokenizer"]


def test_the_recipe_and_the_data_must_fit_the_weights_in_one_line(hf_bloom, hf_data, demo_data, tmp_path):
    model = load_config(TrainRecipe, TINY).model
    src = check_init_from(
        model, tokenizer_of(hf_data), hf_bloom / "model", hf_data
    )  # bloom-tiny's shape: runs as it is
    assert src.kind == "hf" and src.rows == 4000 and len(src.files) > 1  # sharded, read through its index
    wide = load_config(TrainRecipe, TINY, ["model.hidden_size=128", "model.num_heads=4"]).model
    with pytest.raises(
        ConfigError, match=r"'model.hidden_size': is 128, the weights in .* have 64: set -o model.hidden_size=64"
    ):
        check_init_from(wide, tokenizer_of(hf_data), hf_bloom / "model", hf_data)
    with pytest.raises(ConfigError, match="'train.init_from': the data was tokenized with another tokenizer"):
        check_init_from(model, tokenizer_of(demo_data), hf_bloom / "model", demo_data)  # SentencePiece data, same size
    with pytest.raises(ConfigError, match="the data's tokenizer has 5000 tokens, the embedding .* has 4000 rows"):
        check_init_from(model, {**tokenizer_of(hf_data), "vocab_size": 5000}, hf_bloom / "model", hf_data)
    grown = {**tokenizer_of(hf_data), "extends": {"base_vocab_size": 4000, "file": "tokenizer/extension.json"}}
    with pytest.raises(ConfigError, match="the data's tokenizer was grown, but .* lacks the file that says how"):
        check_init_from(model, grown, hf_bloom / "model", hf_data)
    with pytest.raises(CheckpointError, match="neither a Hugging Face BLOOM folder"):
        open_source(tmp_path)


def test_padding_rows_are_dropped_and_grown_rows_are_their_pieces_mean(hf_bloom, hf_data, tmp_path):
    model = load_config(TrainRecipe, TINY, ["model.vocab_size=3990"]).model
    src = open_source(hf_bloom / "model")
    whole = src.tensor(EMBEDDING)
    emb = init_weights(src, model, {**tokenizer_of(hf_data), "vocab_size": 3990}, hf_data)(EMBEDDING)
    assert torch.equal(emb, whole[:3990])  # rows past the tokenizer are the source's padding
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "extension.json").write_text(
        json.dumps({"tokens": [{"id": 4001, "base_pieces": [7, 9]}, {"id": 4000, "base_pieces": [300]}]})
    )
    grown = {"vocab_size": 4002, "extends": {"base_vocab_size": 4000, "file": "tokenizer/extension.json"}}
    emb = init_weights(src, model, grown, tmp_path)(EMBEDDING)
    assert emb.shape == (4002, 64) and torch.equal(emb[:4000], whole)
    assert torch.equal(emb[4000], whole[300]) and torch.allclose(emb[4001], (whole[7] + whole[9]) / 2)


def first_step_batches(data: Path, recipe: TrainRecipe) -> list[dict]:
    """Every micro-batch of step 1, on every data-parallel rank, as the trainer plans and collates them."""
    from training.data.mixture.blend import run_blend
    from training.data.sampler import DynamicBatchSampler
    from training.data.shard_reader import ShardIndex, collate
    from training.planning.flops import model_pair_weight

    index = ShardIndex(data, "train")
    b = run_blend(recipe, index).weights_for(1)
    cfg = recipe.model
    sampler = DynamicBatchSampler(
        index,
        recipe.batch,
        recipe.parallel.dp,
        cfg.seq_len,
        recipe.train.seed,
        blend=b,
        pair_weight=model_pair_weight(cfg),
    )
    plan = sampler.next_step()
    return [collate(index, mb, plan.bucket, index.pad_id) for rank in plan.ranks for mb in rank]


def transformers_loss(hf, batches: list[dict]) -> float:
    """The mean token loss of the batches by transformers' BloomForCausalLM, each packed document
    run alone (bloomline's attention stays inside a document; ALiBi is relative)."""
    total, n = 0.0, 0
    with torch.no_grad():
        for b in batches:
            for ids, labels, seg, length in zip(b["input_ids"], b["labels"], b["segment_ids"], b["lengths"]):
                ids, labels, seg = ids[:length], labels[:length], seg[:length]
                for s in seg.unique():
                    keep = seg == s
                    logits = hf(ids[keep][None]).logits[0].double()
                    total += torch.nn.functional.cross_entropy(
                        logits, labels[keep], ignore_index=-100, reduction="sum"
                    ).item()
                    n += int((labels[keep] != -100).sum())
    return total / n


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [["parallel.dp=2", "parallel.zero_stage=3"], ["parallel.tp=2", "parallel.pp=2"]],
    ids=["tp1-zero3-dp2", "tp2-pp2"],
)
def test_imported_bloom_trains_from_transformers_loss_and_exports_unchanged(hf_bloom, hf_data, tmp_path, layout):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from training.checkpoint.meta import read_meta
    from training.checkpoint.run_dir import RunDir
    from training.hf.to_hf import export

    over = [
        "train.precision=fp32",
        "optim.lr=1e-20",
        "optim.min_lr=0",
        "train.steps=2",
        f"train.init_from={hf_bloom / 'model'}",
        *layout,
    ]
    ok(launch(hf_data, tmp_path / "run", over))
    hf = AutoModelForCausalLM.from_pretrained(hf_bloom / "model", local_files_only=True, dtype=torch.float32).eval()
    recipe = load_config(TrainRecipe, TINY, ["train.steps=4", "checkpoint.interval=2", "optim.decay_steps=30", *over])
    want, got = transformers_loss(hf, first_step_batches(hf_data, recipe)), metrics(tmp_path / "run")[0]["loss"]
    print(f"first-step loss {layout}: bloomline {got!r}, transformers {want!r}")
    assert got == pytest.approx(want, rel=1e-6)
    ck = tmp_path / "run" / "checkpoints" / "step_2"
    assert RunDir(tmp_path / "run").complete_steps() == [0, 2]  # step 0: the imported model, the run's baseline
    assert (
        read_meta(ck)["init_from"]
        == read_meta(ck.parent / "step_0")["init_from"]
        == open_source(hf_bloom / "model").record()
    )
    out = export(ck, tmp_path / "export")
    original = {k: v for f in sorted((hf_bloom / "model").glob("*.safetensors")) for k, v in load_file(f).items()}
    exported = load_file(out / "model.safetensors")
    assert sorted(exported) == sorted(original)
    for k, v in original.items():
        assert torch.allclose(exported[k], v, rtol=1e-6, atol=0), k
    # the tokenizer ships unchanged, and transformers encodes every text of the corpus as from the source
    from transformers import AutoTokenizer

    from tests.support.hf_bloom import SAMPLE, sample_lines

    assert (out / "tokenizer.json").read_bytes() == (hf_bloom / "model" / "tokenizer.json").read_bytes()
    a, b = (AutoTokenizer.from_pretrained(str(d), local_files_only=True) for d in (hf_bloom / "model", out))
    texts = sample_lines(sorted(SAMPLE.rglob("*.jsonl")))
    assert a(texts)["input_ids"] == b(texts)["input_ids"]
    if "parallel.tp=2" in layout:
        evaluated_as_lm_eval_evaluates_the_original(hf_bloom, hf_data, ck, tmp_path)


def evaluated_as_lm_eval_evaluates_the_original(hf_bloom, hf_data, ck, tmp_path):
    """xstorycloze per language: bloomline's evaluation of the imported checkpoint equals
    ``lm_eval --model hf`` (fp32) on the original folder, exactly; bits per byte is finite in every
    language of the data."""
    import math

    from bloomline.task_spec import TaskSpec
    from eval.publish import evaluate
    from eval.tasks import make
    from eval.tasks.lm_eval_local import export_lm_args, run_lm_eval
    from tests.support.task_files import pieces, record, write
    from training.config import EvalConfig

    langs = ["en", "sw", "zh-Hans"]
    for lang in langs:
        write(tmp_path / "xsc", lang, [record("xstorycloze", pieces(hf_data, lang), k) for k in range(6)])
    spec = TaskSpec(name="xstorycloze", data=str(tmp_path / "xsc"), langs=langs)
    ev = evaluate(ck, hf_data, EvalConfig(precision="fp32", prompts_per_lang=0, tasks=[spec]), "imported")
    ours = {
        r["lang"]: r["value"]
        for r in ev.rows
        if r["task"] == "xstorycloze" and r["metric"] == "acc" and r["scope"] == "language"
    }
    names = make(spec).write({l: tmp_path / "xsc" / f"{l}.jsonl" for l in langs}, tmp_path / "yaml")
    theirs = run_lm_eval(
        "hf", list(names.values()), tmp_path / "yaml", None, model_args=export_lm_args(hf_bloom / "model", 512, 2)
    )
    assert ours == {l: theirs["results"][names[l]]["acc,none"] for l in langs}, theirs["results"]
    valid = {r["lang"]: r["bpb"] for r in ev.validation()}
    index_langs = {
        s["lang"] for s in json.loads((hf_data / "manifest.json").read_text())["shards"] if s["split"] == "valid"
    }
    assert index_langs <= set(valid) and all(math.isfinite(v) and v > 0 for v in valid.values())  # groups too


@pytest.mark.slow
def test_a_grown_tokenizer_keeps_old_ids_and_its_new_rows_start_as_their_pieces_mean(hf_bloom, tmp_path):
    """tokenizer.extend_with on two languages' text: every old token keeps its id, each new token is
    cut by the base tokenizer into the pieces extension.json records, and the run that starts from
    the model gives each new token the mean of those pieces' rows (its step 0, before any update);
    restarted from that step 0, it trains step 1 as it did."""
    import shutil

    from data_prep.config import PrepareConfig, SourceConfig
    from data_prep.pipeline import run_all
    from tests.support.hf_bloom import SAMPLE
    from training.checkpoint.load import load_model

    (tmp_path / "in").mkdir()
    for lang in ("sw", "yo"):
        shutil.copy(SAMPLE / "text" / f"{lang}.jsonl", tmp_path / "in")
    cfg = load_config(
        PrepareConfig,
        REPO / "configs/data/demo.yaml",
        [f"tokenizer.model={hf_bloom / 'model'}", "tokenizer.extend_with=40"],
    )
    cfg.sources = [SourceConfig(path=str(tmp_path / "in"))]
    m = run_all(cfg, tmp_path / "data")
    base = json.loads((hf_bloom / "tok" / "tokenizer.json").read_text())["model"]["vocab"]
    grown = json.loads((tmp_path / "data" / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    ext = json.loads((tmp_path / "data" / "tokenizer" / "extension.json").read_text())
    assert m["tokenizer"]["vocab_size"] == 4040 and m["tokenizer"]["extends"]["base_vocab_size"] == 4000
    assert {t: grown[t] for t in base} == base  # every old id unchanged
    from tokenizers import Tokenizer

    old = Tokenizer.from_file(str(hf_bloom / "tok" / "tokenizer.json"))
    assert [t["id"] for t in ext["tokens"]] == list(range(4000, 4040))
    assert all(
        [p.id for p in old.model.tokenize(t["token"])] == t["base_pieces"] and len(t["base_pieces"]) > 1
        for t in ext["tokens"]
    )
    over = ["train.precision=fp32", "train.steps=1", "model.vocab_size=4040", f"train.init_from={hf_bloom / 'model'}"]
    ok(launch(tmp_path / "data", tmp_path / "run", over))
    model, _ = load_model(tmp_path / "run" / "checkpoints" / "step_0")
    emb, src = model.state_dict()[EMBEDDING], open_source(hf_bloom / "model").tensor(EMBEDDING)
    assert torch.equal(emb[:4000], src)
    for t in ext["tokens"]:
        assert torch.allclose(emb[t["id"]], src[t["base_pieces"]].mean(0), rtol=0, atol=1e-7)
    # a job that died after step 0 restarts from it: the imported model, not the seed's or a new import
    first = metrics(tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_1")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_0")
    ok(launch(tmp_path / "data", tmp_path / "run", over))
    assert metrics(tmp_path / "run") == first or [m["loss"] for m in metrics(tmp_path / "run")] == [
        m["loss"] for m in first
    ]


def test_a_bloomline_checkpoint_and_a_pickled_folder_are_sources_too(hf_bloom, hf_data, tmp_path):
    """A bloomline checkpoint (its run folder: the latest) gives its weights as load_model does; a
    folder with only pytorch_model.bin is read through the safe loader: a planted callable runs
    nothing and is refused in one line."""
    from transformers import AutoModelForCausalLM

    from tests.support.checkpoints import Planted, one_rank_checkpoint
    from training.model.bloom import Bloom

    r = load_config(TrainRecipe, TINY, ["parallel.zero_stage=0"])
    bloom = Bloom(r.model, seed=3)
    one_rank_checkpoint(tmp_path / "run" / "checkpoints" / "step_1", bloom.state_dict(), r, hf_data)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_1")
    src = check_init_from(r.model, tokenizer_of(hf_data), tmp_path / "run", hf_data)
    assert src.kind == "bloomline" and src.path.name == "step_1"
    for name, t in bloom.state_dict().items():
        assert torch.equal(src.tensor(name), t[:4000] if name == EMBEDDING else t), name

    hf = AutoModelForCausalLM.from_pretrained(hf_bloom / "model", local_files_only=True)
    hf.save_pretrained(tmp_path / "bin", safe_serialization=False)
    if not (tmp_path / "bin" / "pytorch_model.bin").exists():  # transformers 5 always writes safetensors
        (tmp_path / "bin" / "model.safetensors").unlink()
        torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    src = open_source(tmp_path / "bin")
    assert torch.equal(src.tensor(EMBEDDING), open_source(hf_bloom / "model").tensor(EMBEDDING))
    marker = tmp_path / "ran"
    torch.save({**hf.state_dict(), "x": Planted(marker)}, tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="is refused: it names posix.system"):
        open_source(tmp_path / "bin").tensor(EMBEDDING)
    assert not marker.exists()
