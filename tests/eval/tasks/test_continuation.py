"""The continuation task (eval/tasks/continuation.py): items and scoring against a hand-computed
example, and a run over every language of the demo data."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from eval.model import LocalModel
from eval.tasks.continuation import CHOICES, CONTEXT, LENGTH, items, score

REPO = Path(__file__).resolve().parents[3]
V = 500
CPU = torch.device("cpu")


class Successor(torch.nn.Module):
    """A model that is sure the next token is this one plus one, in Bloom's parts as LocalModel
    runs them: one layer whose hidden states are the logits, and an output layer that passes them on."""

    cfg = SimpleNamespace(vocab_size=V)

    def layers(self):
        return [("next", lambda x: (20.0 * torch.nn.functional.one_hot((x[0] + 1) % V, V).float(), x[1]))]

    def embedding(self, x, project=False):
        return x[0]


def test_the_predictable_ending_wins_half_the_items_by_hand():
    """Eight documents: the even ones count up (the model predicts every token of their endings),
    the odd ones are random. An even item's true ending continues its context, and every distractor
    misses at least its first token: right. An odd item's true ending is random, and one distractor,
    an even document's ending, misses only its first token: wrong. acc = acc_bytes = 4/8."""
    rng = np.random.default_rng(0)
    n = CONTEXT + LENGTH
    docs = [np.arange(100 * i, 100 * i + n) % V if i % 2 == 0 else rng.integers(0, V, n) for i in range(8)]
    its = items(docs, 8)
    assert len(its) == 8
    for i, (context, endings, answer) in enumerate(its):
        assert answer == i % CHOICES and len(endings) == CHOICES
        assert np.array_equal(context, docs[i][:CONTEXT]) and np.array_equal(endings[answer], docs[i][CONTEXT:n])
        assert all(len(e) == LENGTH for e in endings)
    assert score(LocalModel(Successor(), CPU), np.ones(V, dtype=np.int64), its) == (4, 4)


def test_per_byte_scoring_can_disagree_with_the_total():
    """Two endings of equal log-likelihood per token: the one whose tokens stand for more bytes
    has the higher log-likelihood per byte."""
    context = np.arange(CONTEXT)
    endings = [np.full(LENGTH, 7), np.full(LENGTH, 9), np.full(LENGTH, 11), np.full(LENGTH, 13)]

    class Flat(Successor):
        """Every token equally likely."""

        def layers(self):
            return [("flat", lambda x: (torch.zeros(*x[0].shape, V), x[1]))]

    tb = np.ones(V, dtype=np.int64)
    tb[9] = 3  # ending 1's tokens stand for 3 bytes each
    assert score(LocalModel(Flat(), CPU), tb, [(context, endings, 1)]) == (0, 1)  # by total: a tie, the first wins


def test_every_language_of_the_data_gets_its_rows(demo_data):
    """A random bloom-tiny on the demo data: rows for every language (code included) or a skip
    with its reason, accuracy with a standard error, and group and overall means."""
    import sentencepiece as spm

    from bloomline.config import load_config
    from bloomline.task_spec import TaskSpec
    from bloomline.tokenizer import token_bytes
    from eval.tasks import make
    from eval.tasks.base import Context
    from training.config import EvalConfig, ModelConfig
    from training.data.shard_reader import ShardIndex
    from training.model.bloom import Bloom

    cfg = load_config(ModelConfig, REPO / "configs/model/bloom-tiny.yaml")
    index = ShardIndex(demo_data, "valid")
    model_file = demo_data / "tokenizer" / "tokenizer.model"
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    spec = TaskSpec(name="continuation", limit=5)
    ctx = Context(
        model=LocalModel(Bloom(cfg, seed=1), CPU),
        tokenizer=sp,
        index=index,
        token_bytes=token_bytes(model_file),
        tokenizer_file=model_file,
        eos_id=sp.eos_id(),
        settings=EvalConfig(),
        spec=spec,
    )
    rows = make(spec).run(ctx)
    langs = {r.lang for r in rows if r.scope == "language"}
    assert langs == set(index.languages) and any(l.startswith("code-") for l in langs)
    acc = [r for r in rows if r.metric == "acc" and r.scope == "language"]
    skipped = [r for r in rows if r.metric == "skipped"]
    assert len(acc) + len(skipped) == len(langs) and acc
    assert all(r.note.startswith("fewer than 4 windows of 48 tokens") for r in skipped)
    for r in acc:
        assert 0 <= r.value <= 1 and 1 <= r.n <= 5 and (r.n == 1 or r.stderr >= 0)
    overall = [r for r in rows if r.scope == "overall" and r.metric == "acc"]
    assert len(overall) == 1 and overall[0].value == pytest.approx(np.mean([r.value for r in acc]))
