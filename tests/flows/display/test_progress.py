"""Training progress read from metrics.jsonl while the ranks run: the line, the ETA, and the
Prefect progress artifact of a real flow run."""

import asyncio
import json
import time

import pytest

from flows.display.progress import TrainProgress


def write(metrics, steps, t0, per_step=2.0, tail=""):
    with open(metrics, "a") as f:
        for s in steps:
            f.write(
                json.dumps({"step": s, "loss": 9.0 - s / 10, "tokens_per_s": 1000.0 * s, "time": t0 + per_step * s})
                + "\n"
            )
        f.write(tail)


def test_lines_eta_and_half_written_lines(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    write(metrics, [1], 0.0)  # an earlier attempt's line: not this attempt's progress
    lines = []
    p = TrainProgress(metrics, 10, lines.append, every_s=0, artifact_key=None)
    p()
    assert lines == []
    write(metrics, [2, 3, 4], 0.0, tail='{"step": 5, "lo')  # the ranks are writing step 5
    p()
    assert lines == ["step 4/10 (40%) | loss 8.6000 | 3,000 tokens/s | ETA 0:00:12"]  # 6 steps × 2 s
    p()  # nothing new: nothing said
    assert len(lines) == 1
    with open(metrics, "a") as f:
        f.write('ss": 8.5, "tokens_per_s": 5000.0, "time": 10.0}\n')
    p()
    assert lines[-1].startswith("step 5/10 (50%) | loss 8.5000") and lines[-1].endswith("ETA 0:00:10")


def test_reports_are_spaced_but_the_last_step_is_always_said(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    lines = []
    p = TrainProgress(metrics, 3, lines.append, every_s=3600, artifact_key=None)
    write(metrics, [1], 0.0)
    p()
    write(metrics, [2], 0.0)
    p()  # within every_s of the last report
    write(metrics, [3], 0.0)
    p()
    assert [l.split(" ")[1] for l in lines] == ["1/3", "3/3"]


@pytest.mark.slow
def test_a_progress_artifact_follows_the_run(tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    metrics = tmp_path / "metrics.jsonl"

    @flow
    def training():
        p = TrainProgress(metrics, 4, lambda line: None, every_s=0)
        write(metrics, [1, 2], time.time())
        p()
        write(metrics, [3, 4], time.time())
        p()
        return str(p.artifact_id)

    async def read(artifact_id):
        async with get_client() as client:
            arts = await client.read_artifacts()
            return [a for a in arts if str(a.id) == artifact_id][0]

    with prefect_test_harness(server_startup_timeout=180):
        artifact_id = training()
        art = asyncio.run(read(artifact_id))
    assert art.key == "train-progress" and art.type == "progress"
    assert float(art.data) == 100.0 and art.description.startswith("step 4/4 (100%)")
