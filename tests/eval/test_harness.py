"""lm-evaluation-harness runs offline on an export and gives bits per byte by its own rule, which
is reproduced here from the model's logits; bloomline's differs by definition (eval/harness.py)."""

import math
from pathlib import Path

import pytest
import torch

from bloomline.config import load_config
from bloomline.io import sha256_file
from training.checkpoint import make_meta
from training.config import TrainRecipe
from training.model import Bloom

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(demo_data):
    return demo_data  # prepared once per session (tests/conftest.py)


def test_lm_eval_bits_per_byte_on_an_export(demo, tmp_path):
    import json

    import sentencepiece as spm

    from training.config import EvalConfig
    from eval.evaluate import evaluate
    from eval.export import export
    from eval.harness import lm_eval_bits_per_byte, validation_documents

    # a 1-rank checkpoint of a seeded bloom-tiny (the files DeepSpeed writes at ZeRO 0)
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.zero_stage=0"])
    model = Bloom(r.model, seed=3).eval()
    step = tmp_path / "run" / "checkpoints" / "step_1"
    step.mkdir(parents=True)
    torch.save({"module": model.state_dict()}, step / "mp_rank_00_model_states.pt")
    sampler = {"version": 2, "seed": 1, "step": 1, "consumed_tokens": 0, "tokens_by_lang": {}, "streams": {}}
    meta = make_meta(1, r, demo, sha256_file(demo / "manifest.json"), sampler,
                     {"skipped": 0, "fp16_overflows": 0, "skipped_in_a_row": 0, "loss_ema": None})
    (step / "bloomline.json").write_text(json.dumps(meta))
    hf = export(step, tmp_path / "hf")

    lang = "sw"
    got = lm_eval_bits_per_byte(hf, demo, lang, tmp_path / "lm-eval", max_length=512)
    # lm-eval's rule: every token predicted, the first conditioned on </s>; over all of the text's bytes
    sp = spm.SentencePieceProcessor(model_file=str(demo / "tokenizer" / "tokenizer.model"))
    nll = n_bytes = 0.0
    docs = validation_documents(demo, lang)
    with torch.no_grad():
        for d in docs:
            ids = [sp.eos_id(), *sp.encode(d)]
            logp = torch.log_softmax(model(torch.tensor([ids]))[0, :-1, :r.model.vocab_size].float(), -1)
            nll -= float(logp.gather(1, torch.tensor(ids[1:])[:, None]).sum())
            n_bytes += len(d.encode("utf-8"))
    want = nll / (math.log(2) * n_bytes)
    ours = next(x for x in evaluate(step, demo, EvalConfig(prompts_per_lang=0), "run").rows if x["lang"] == lang)
    print(f"{lang}, {len(docs)} document(s): lm-eval bits_per_byte {got['bits_per_byte']:.5f}, its rule "
          f"reimplemented {want:.5f}, bloomline bpb {ours['bpb']:.5f}")
    assert got["documents"] == len(docs) >= 1
    assert got["bits_per_byte"] == pytest.approx(want, rel=1e-4)
    assert ours["bpb"] != pytest.approx(want, rel=1e-4)  # another definition: first token, its bytes
