"""Bits per byte with a byte-level tokenizer (eval/tasks/validation.py, bloomline/tokenizer.py
``token_bytes``) equals a hand computation with transformers' model on a few small texts, one
holding characters that byte-level tokens cut in the middle."""

import json
import math

import pytest
import torch

TEXTS = [
    "Habari za asubuhi, dunia! 🙂 Leo ni siku nzuri sana.",
    "Naïve café — 東京 and ஆங்கிலம் side by side.",
    "def f(x):\n\treturn x  # 42 ✓",
    "Mvua kubwa ilinyesha jana usiku kijijini.",
    "Watoto walicheza mpira uwanjani jioni.",
    "Soko la samaki lilifunguliwa mapema asubuhi.",
]


def test_bits_per_byte_is_transformers_nll_over_the_texts_bytes(hf_bloom, tmp_path):
    from transformers import AutoModelForCausalLM

    from bloomline.config import load_config
    from bloomline.tokenizer import open_tokenizer
    from data_prep.config import PrepareConfig, SourceConfig
    from data_prep.pipeline import run_all
    from eval.model import LocalModel
    from eval.tasks.validation import evaluate_model
    from tests.support.hf_bloom import REPO
    from training.config import EvalConfig, TrainRecipe
    from training.data.shard_reader import ShardIndex
    from training.hf.from_hf import open_source
    from training.model.bloom import Bloom
    from training.parallel.layout import tp_slice

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "sw.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "text": t, "lang": "sw"}) + "\n" for i, t in enumerate(TEXTS))
    )
    over = [
        f"tokenizer.model={hf_bloom / 'model'}",
        "filters.enabled=false",
        "langid.enabled=false",
        "pack.valid_min_docs=3",
        "pack.buckets=[512]",
        "pii.enabled=false",
    ]
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", over)
    cfg.sources = [SourceConfig(path=str(tmp_path / "in"))]
    run_all(cfg, tmp_path / "data")
    tok, index = open_tokenizer(tmp_path / "data" / "tokenizer"), ShardIndex(tmp_path / "data", "valid")

    model_cfg = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml").model
    bloom, src = Bloom(model_cfg), open_source(hf_bloom / "model")
    with torch.no_grad():
        for name, p in bloom.named_parameters():
            p.copy_(tp_slice(name, src.tensor(name), 0, 1, p.shape[0]))
    got = evaluate_model(LocalModel(bloom, torch.device("cpu")), index, EvalConfig(), tok.token_bytes(), tok.eos_id)[
        "sw"
    ]

    hf = AutoModelForCausalLM.from_pretrained(hf_bloom / "model", local_files_only=True, dtype=torch.float32).eval()
    nll, nbytes, docs = 0.0, 0, []
    for sid in range(len(index.shards)):
        for row in range(index.shards[sid]["rows"]):
            toks, offsets = index.fetch(sid, row)
            docs += [toks[a:b].tolist() for a, b in zip(offsets, [*offsets[1:], len(toks)])]
    for ids in docs:
        text = tok.decode(ids)
        assert text in TEXTS and ids == [*tok.encode(text), tok.eos_id]
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
        nll -= sum(
            logp[i - 1, ids[i]].item() for i in range(1, len(ids) - 1)
        )  # the text's tokens after the first; not </s>
        nbytes += len(text.encode("utf-8")) - len(
            tok.decode(ids[:1]).encode("utf-8")
        )  # the first token is not predicted
    assert len(docs) == 3 and got.docs == 3 and got.bytes == nbytes
    assert got.bpb == pytest.approx(nll / math.log(2) / nbytes, rel=1e-6)
