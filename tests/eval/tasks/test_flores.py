"""``flores``: each direction's chrF++ equals sacrebleu's over translations computed here by plain
greedy decoding of the documented prompt (one at a time, no cache: the task decodes them together),
cut at the first newline; a pair lacking a text skips its language naming file:line."""

import json
from pathlib import Path

import torch

from bloomline.config import load_config
from bloomline.task_spec import TaskSpec
from training.config import EvalConfig, ModelConfig

REPO = Path(__file__).resolve().parents[3]
PAIRS = {
    "fr": [
        ("The cat sleeps on the warm roof.", "Le chat dort sur le toit chaud."),
        ("We will meet at the market tomorrow.", "Nous nous verrons au marché demain."),
        ("The river rose after the rain.", "La rivière a monté après la pluie."),
    ],
    "zh-Hans": [
        ("The cat sleeps on the warm roof.", "猫睡在温暖的屋顶上。"),
        ("The river rose after the rain.", "雨后河水上涨了。"),
    ],
}


@torch.no_grad()
def test_chrf_of_greedy_translations_both_ways_and_a_bad_pair(demo_data, tmp_path):
    import sentencepiece as spm
    from sacrebleu.metrics import CHRF

    from bloomline.tokenizer import token_bytes
    from eval.model import LocalModel
    from eval.tasks import make
    from eval.tasks.base import Context
    from training.data.shard_reader import ShardIndex
    from training.model.bloom import Bloom

    data = tmp_path / "flores"
    data.mkdir()
    for lang, pairs in PAIRS.items():
        (data / f"{lang}.jsonl").write_text(
            "".join(json.dumps({"en": e, lang: t}, ensure_ascii=False) + "\n" for e, t in pairs), encoding="utf-8"
        )
    (data / "sw.jsonl").write_text(json.dumps({"en": "Hello.", "fr": "Bonjour."}) + "\n")
    model_file = demo_data / "tokenizer" / "tokenizer.model"
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    model = Bloom(load_config(ModelConfig, REPO / "configs/model/bloom-tiny.yaml"), seed=5).eval()
    spec = TaskSpec(name="flores", data=str(data), langs=["fr", "zh-Hans", "sw"])
    ctx = Context(
        model=LocalModel(model, torch.device("cpu")),  # decodes the prompts together, through its cache
        tokenizer=sp,
        index=ShardIndex(demo_data, "valid"),
        token_bytes=token_bytes(model_file),
        tokenizer_file=model_file,
        eos_id=sp.eos_id(),
        settings=EvalConfig(),
        spec=spec,
    )
    rows = {(r.lang, r.metric): r for r in make(spec).run(ctx) if r.scope == "language"}

    def by_hand(text: str, src: str, tgt: str) -> str:
        ids = sp.encode(f"{src}: {text}\n{tgt}:")
        start = len(ids)
        for _ in range(min(128, 2 * len(sp.encode(text)) + 8)):
            nxt = int(model(torch.tensor([ids]))[0, -1, : model.cfg.vocab_size].argmax())
            if nxt == sp.eos_id():
                break
            ids.append(nxt)
        return sp.decode(ids[start:]).split("\n")[0].strip()

    names = {"fr": "French", "zh-Hans": "Chinese (Simplified)"}
    hyps_all = []
    for lang, pairs in PAIRS.items():
        out = [by_hand(e, "English", names[lang]) for e, _ in pairs]
        back = [by_hand(t, names[lang], "English") for _, t in pairs]
        hyps_all += out + back
        assert rows[lang, "chrf_from_en"].value == CHRF(word_order=2).corpus_score(out, [[t for _, t in pairs]]).score
        assert rows[lang, "chrf_to_en"].value == CHRF(word_order=2).corpus_score(back, [[e for e, _ in pairs]]).score
        assert rows[lang, "chrf_to_en"].n == len(pairs)
    assert any(hyps_all)  # the model wrote something: the scores are over real text
    assert rows["sw", "skipped"].note == (
        f"malformed record: {data / 'sw.jsonl'}:1: the record needs the texts 'sw' "
        f'(flores records are {{"en": ..., "sw": ...}})'
    )
