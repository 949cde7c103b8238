"""The parallel evaluator (eval/parallel/) against the single-process one, on real ranks (DeepSpeed's
launcher, gloo): two bloom-tiny checkpoints of other layouts (TP2×PP2, and DP2 with ZeRO-1),
each evaluated in one process and on tp·pp ranks, must give the same results."""

import time
import types
from pathlib import Path

import psutil
import pytest
import torch

from bloomline.config import from_dict
from bloomline.errors import ConfigError
from bloomline.tokenizer import token_bytes
from eval.evaluate import generations
from eval.model import LocalModel
from eval.publish import evaluate
from eval.tasks.continuation import CHOICES, CONTEXT, LENGTH, batch_loglikelihoods, documents, items
from tests.support.train_runs import launch, ok
from training.checkpoint.load import load_model
from training.config import EvalConfig
from training.data.shard_reader import ShardIndex

pytestmark = pytest.mark.slow

LAYOUTS = {"tp2pp2": "tp=2 pp=2 dp=1 zero_stage=1", "dp2": "tp=1 pp=1 dp=2 zero_stage=1"}
"""The checkpoints' training layouts (the results' ``layout``)."""
LIMIT = 8
"""Continuation items per language: ~420 over the demo data's languages."""
RTOL = 1e-5
"""What the ranks' other summation order may move a loss (measured: under 1e-6)."""
EXACT = ("tokens", "bytes", "docs", "acc", "acc_bytes")
"""Counts, and accuracies over items whose best ending wins by far more than RTOL (test_fair)."""


def settings(tp: int = 1, pp: int = 1) -> EvalConfig:
    return from_dict(
        EvalConfig,
        {
            "device": "cpu",
            "threads": 1,
            "max_tokens_per_lang": 300,
            "prompts_per_lang": 1,
            "new_tokens": 6,
            "parallel": {"tp": tp, "pp": pp},
            "tasks": [{"name": "continuation", "limit": LIMIT}],
        },
    )


@pytest.fixture(scope="module")
def checkpoints(demo_data, tmp_path_factory):
    """Step 2 (fp32) of a TP2×PP2 run and of a DP2 ZeRO-1 run, of 8,192 tokens a step: the
    checkpoints whose margins test_fair measured."""
    out = {}
    batch = ["batch.tokens_per_step=8192", "batch.micro_batch_tokens=2048"]
    for name, layout in {"tp2pp2": ["parallel.tp=2", "parallel.pp=2"], "dp2": ["parallel.dp=2"]}.items():
        run = tmp_path_factory.mktemp(name)
        ok(launch(demo_data, run, ["train.steps=2", "train.precision=fp32", *batch, *layout]))
        out[name] = run / "checkpoints" / "step_2"
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """This process's model work on one torch thread, as the settings' ``threads`` give each rank
    (torch's default, a thread per core, contends with whatever else runs: test_fair beside one busy
    process on 2 cores, measured, 7.7 s with two threads, 4.8 s with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def single(checkpoints, demo_data):
    """Each checkpoint's evaluation in this process (the reference)."""
    return {name: evaluate(ck, demo_data, settings(), "r") for name, ck in checkpoints.items()}


def by_key(ev) -> dict:
    rows = {(r["task"], r["scope"], r["lang"], r["weighting"], r["metric"]): r for r in ev.rows}
    assert len(rows) == len(ev.rows)  # the key is a row's identity
    return rows


def ours(ckpt: Path) -> list[psutil.Process]:
    """Live processes of a parallel evaluation of ``ckpt`` (the launcher and its ranks)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "eval/parallel/main.py" in cmd and str(ckpt.resolve()) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()}


@pytest.mark.parametrize("name, tp, pp", [("tp2pp2", 2, 2), ("tp2pp2", 1, 2), ("dp2", 2, 1)])
def test_ranks_match_one_process(checkpoints, single, demo_data, name, tp, pp):
    """The ranks give the single process's rows (no more, no fewer), counts, accuracies and
    generations, losses within RTOL, each row naming the layout it ran in; the job leaves no
    process and no /dev/shm file behind."""
    ckpt = checkpoints[name]
    before = shm()
    ev = evaluate(ckpt, demo_data, settings(tp, pp), "r")
    assert ours(ckpt) == []  # every rank and the launcher ended with the evaluation
    assert shm() - before == set()  # no rank left a shared-memory buffer behind

    ref = single[name]
    want, got = by_key(ref), by_key(ev)
    assert set(got) == set(want)
    assert {k[0] for k in got} == {"validation", "continuation"}
    for k, r in want.items():
        g = got[k]
        assert g["eval_layout"] == f"tp={tp} pp={pp} device=cpu" and r["eval_layout"] == "tp=1 pp=1 device=cpu"
        assert g["layout"] == LAYOUTS[name]
        for f in r:
            if f in ("eval_layout", "evaluated_at"):
                continue
            if f in ("value", "stderr") and k[-1] not in EXACT and r[f] is not None:
                assert g[f] == pytest.approx(r[f], rel=RTOL), (k, f)
            else:
                assert g[f] == r[f], (k, f)  # counts, accuracies, the checkpoint's identity
    assert [g["completion"] for g in ev.generations] == [g["completion"] for g in ref.generations]
    assert len(ev.generations) == len(ref.generations) > 0


@pytest.mark.parametrize("name", ["tp2pp2", "dp2"])
def test_fair(checkpoints, demo_data, name):
    """Identical accuracies and generations are a fair demand of these checkpoints: every item's best
    ending beats the next by far more than RTOL lets a log-likelihood move, and so does every greedy
    token (in logits)."""
    bloom, _ = load_model(checkpoints[name], torch.float32)
    model = LocalModel(bloom, torch.device("cpu"))
    index = ShardIndex(demo_data, "valid")
    tok = index.manifest["tokenizer"]
    nbytes = token_bytes(demo_data / tok["path"])
    ctx = types.SimpleNamespace(index=index, eos_id=int(tok["eos_id"]))  # what documents() reads
    margins = []
    for lang in index.languages:  # as Continuation.run picks its items
        its = items(documents(ctx, lang, CONTEXT + LENGTH, LIMIT + CHOICES), LIMIT)
        if its:
            for (_, endings, _), ll in zip(its, batch_loglikelihoods(model, [(c, e) for c, e, _ in its])):
                per_byte = [v / max(int(nbytes[e].sum()), 1) for v, e in zip(ll, endings)]
                for scores in (ll, per_byte):
                    top = sorted(scores, reverse=True)
                    margins.append((top[0] - top[1]) / (RTOL * abs(top[0])))
    assert len(margins) > 300 and min(margins) > 1  # measured: 1.55 (log-likelihood), 74 (per byte)

    gaps = []
    with torch.no_grad():
        for g in generations(model, index, settings(), list, ctx.eos_id):
            logits = bloom(torch.tensor([g["prompt"] + g["completion"]]))[0, :, : bloom.cfg.vocab_size]
            for j in range(len(g["completion"])):
                top = logits[len(g["prompt"]) - 1 + j].topk(2).values
                gaps.append((top[0] - top[1]).item())
    assert len(gaps) > 100 and min(gaps) > 0.1  # measured: 0.44


@pytest.mark.parametrize(
    "tp, pp, why",
    [
        (3, 1, "num_heads=4 is not divisible by tp=3"),
        (1, 5, "pp=5 pipeline stages need at least 5 layers, the model has 4"),
    ],
)
def test_layout_that_does_not_cut_the_model(checkpoints, demo_data, tp, pp, why):
    """Refused in one line before any rank starts."""
    ckpt = checkpoints["tp2pp2"]
    logs = ckpt.parents[1] / "logs"
    before = sorted((p.name, p.stat().st_size) for p in logs.glob("eval_step_*.log"))
    t = time.monotonic()
    with pytest.raises(ConfigError) as e:
        evaluate(ckpt, demo_data, settings(tp, pp), "r")
    assert time.monotonic() - t < 5  # a launcher alone takes longer to start
    assert why in str(e.value) and "\n" not in str(e.value)
    assert sorted((p.name, p.stat().st_size) for p in logs.glob("eval_step_*.log")) == before
    assert ours(ckpt) == []
