"""The parallel model is the single-device Bloom: same loss and gradients at every layout (fp32,
same seed and batch), on real ranks (DeepSpeed launcher, gloo)."""

import json
import os
from pathlib import Path

import pytest

from training.loop.launch import launcher, run_job

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("equivalence_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_parallel_model_matches_bloom(tmp_path, tp, pp):
    world = tp * pp
    cmd = [
        *launcher(world),
        str(WORKER),
        "--tp",
        str(tp),
        "--pp",
        str(pp),
        "--out",
        str(tmp_path),
    ]
    log = tmp_path / "log.txt"
    rc = run_job(cmd, log, {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}, timeout=300, cwd=REPO)
    assert rc == 0, log.read_text()[-4000:]
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(world)]
    worst = 0.0
    compared = set()
    for r in ranks:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-6), r
        for name, err in r["grad_rel_errors"].items():
            assert err <= 1e-4, (name, err, r["tp_rank"], r["pp_rank"])
            worst = max(worst, err)
            compared.add(name)
    print(
        f"tp={tp} pp={pp}: loss {ranks[0]['loss']:.7f} vs {ranks[0]['ref_loss']:.7f}, worst gradient relative "
        f"error {worst:.2e} over {len(compared)} parameter names"
    )
    # every parameter of the model was compared on some rank: 4 blocks x 12, the embedding, 2 norms x 2
    assert len(compared) == 4 * 12 + 1 + 4


@pytest.mark.slow
def test_compiled_blocks_compute_the_same_function():
    """train.compile: every block torch.compile'd in place, names unchanged; fp32 loss and
    gradients equal the eager model's (one shape: a compile on CPU takes tens of seconds)."""
    import torch

    from training.config import ModelConfig
    from training.model.bloom import Bloom, segment_ids_from_offsets
    from training.parallel.parallelize import apply_compile

    cfg = ModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, seq_len=64, attention="sdpa")
    eager, compiled = Bloom(cfg, seed=3), Bloom(cfg, seed=3)
    apply_compile(compiled)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    ids = torch.randint(0, 300, (2, 64), generator=torch.Generator().manual_seed(0))
    seg = segment_ids_from_offsets([[0, 20], [0]], [64, 50], 64)
    grads = []
    for m in (eager, compiled):
        loss = Bloom.loss(m(ids, seg)[:, :-1], ids[:, 1:])
        loss.backward()
        grads.append((loss.item(), {n: p.grad for n, p in m.named_parameters()}))
    assert abs(grads[0][0] - grads[1][0]) < 1e-5
    assert all((grads[0][1][n] - grads[1][1][n]).abs().max() < 1e-5 for n in grads[0][1])
