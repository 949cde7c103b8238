"""Starting and ending a parallel evaluation (eval/parallel/launch.py): an evaluation that runs past
its timeout is stopped, every rank killed, and fails in one line; the ranks' error lines reach
the user."""

import time
from pathlib import Path

import psutil
import pytest

from bloomline.config import from_dict, load_config
from tests.support.checkpoints import one_rank_checkpoint
from training.config import EvalConfig, TrainRecipe
from training.model.bloom import Bloom

REPO = Path(__file__).resolve().parents[3]


def checkpoint(demo: Path, folder: Path) -> Path:
    """A 1-rank checkpoint of an untrained bloom-tiny, as DeepSpeed writes it at ZeRO 0."""
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.zero_stage=0"])
    return one_rank_checkpoint(folder / "run" / "checkpoints" / "step_1", Bloom(r.model, seed=3).state_dict(), r, demo)


def ranks_of_this_test() -> list[psutil.Process]:
    """This process's live children, but the reaper that an earlier in-process test made this
    process a job's driver with (flows/run/lifeline.py: it lives as long as its driver), the
    session's Prefect server (tests/conftest.py) and multiprocessing's resource tracker (started by
    an earlier in-process test's pool; it lives as long as this process)."""
    me = psutil.Process()
    return [
        p
        for p in me.children(recursive=True)
        if p.is_running()
        and p.status() != psutil.STATUS_ZOMBIE
        and not any(
            s in _cmdline(p)
            for s in ("flows.run.lifeline", "prefect.server.api.server", "multiprocessing.resource_tracker")
        )
    ]


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_an_evaluation_past_its_timeout_is_stopped_in_one_line_with_no_rank_left(demo_data, tmp_path):
    from eval.parallel.launch import EvaluationFailed
    from eval.publish import evaluate

    step = checkpoint(demo_data, tmp_path)
    cfg = from_dict(EvalConfig, {"parallel": {"pp": 2, "timeout_s": 1}, "prompts_per_lang": 0})
    t0 = time.monotonic()
    with pytest.raises(EvaluationFailed) as e:
        evaluate(step, demo_data, cfg, "run")
    assert time.monotonic() - t0 < 30
    assert "\n" not in str(e.value) and "ran past parallel.timeout_s=1 s and was stopped" in str(e.value)
    left = ranks_of_this_test()
    assert not left, [_cmdline(p) for p in left]


def test_a_ranks_refusal_reaches_the_user_as_its_own_line(demo_data, tmp_path):
    """A checkpoint file cut short is met by the ranks, not by the process that starts them: the
    error line a rank prints is what the evaluation fails with."""
    from eval.parallel.launch import EvaluationFailed
    from eval.publish import evaluate

    step = checkpoint(demo_data, tmp_path)
    f = step / "mp_rank_00_model_states.pt"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(EvaluationFailed) as e:
        evaluate(step, demo_data, from_dict(EvalConfig, {"parallel": {"pp": 2}}), "run")
    assert "\n" not in str(e.value) and str(e.value).startswith(str(f)), e.value
    left = ranks_of_this_test()
    assert not left, [_cmdline(p) for p in left]
