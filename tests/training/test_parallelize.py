"""The parallel model is the single-device Bloom: same loss and gradients at every layout (fp32,
same seed and batch), on real ranks (DeepSpeed launcher, gloo)."""

import json
import os
import sys
from pathlib import Path

import pytest

from training.launch import free_port, run_job

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("equivalence_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_parallel_model_matches_bloom(tmp_path, tp, pp):
    world = tp * pp
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(world), "--master_port",
           str(free_port()), str(WORKER), "--tp", str(tp), "--pp", str(pp), "--out", str(tmp_path)]
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
    print(f"tp={tp} pp={pp}: loss {ranks[0]['loss']:.7f} vs {ranks[0]['ref_loss']:.7f}, worst gradient relative "
          f"error {worst:.2e} over {len(compared)} parameter names")
    # every parameter of the model was compared on some rank: 4 blocks x 12, the embedding, 2 norms x 2
    assert len(compared) == 4 * 12 + 1 + 4
