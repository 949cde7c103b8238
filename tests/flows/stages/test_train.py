"""The restart loop of the train flow and of a worker node (flows/stages/train_job.py ``restarted``)."""

from bloomline.errors import BloomlineError
from flows.stages.train_job import restarted
from training.loop.launch import EXIT_OK, EXIT_USER_ERROR


def run(tmp_path, statuses, attempts=3):
    calls, failures = [], []

    def once(attempt, log_file):
        calls.append((attempt, log_file.name))
        log_file.write_text(
            "a line\nerror: data.sources: no such file\n" if statuses[attempt - 1] == EXIT_USER_ERROR else "a line\n"
        )
        return statuses[attempt - 1]

    try:
        return (
            restarted(once, attempts, tmp_path, lambda rc, f: failures.append((rc, f.name)), "gave up"),
            calls,
            failures,
        )
    except BloomlineError as e:
        return str(e), calls, failures


def test_a_crash_is_retried_and_the_attempts_counted(tmp_path):
    assert run(tmp_path, [1, -9, EXIT_OK]) == (
        3,
        [(1, "attempt-1.log"), (2, "attempt-2.log"), (3, "attempt-3.log")],
        [(1, "attempt-1.log"), (-9, "attempt-2.log")],
    )


def test_a_user_error_stops_at_once_with_its_line(tmp_path):
    assert run(tmp_path, [EXIT_USER_ERROR, EXIT_OK]) == (
        "training stopped: data.sources: no such file",
        [(1, "attempt-1.log")],
        [],
    )


def test_every_attempt_failing_gives_up_after_the_last(tmp_path):
    msg, calls, failures = run(tmp_path, [1, 1, 1])
    assert msg == "gave up" and len(calls) == 3 and len(failures) == 3


def test_an_evaluation_layout_that_cannot_cut_the_model_is_refused_before_training(demo_data):
    """Every evaluation beside training would fail: refused with the key as the recipe spells it."""
    from pathlib import Path

    import pytest

    from bloomline.config import load_config
    from bloomline.errors import ConfigError
    from flows.stages.train_job import validate
    from training.config import TrainRecipe

    repo = Path(__file__).resolve().parents[3]
    r = load_config(TrainRecipe, repo / "configs/train/bloom-tiny.yaml", ["evaluation.settings.parallel.tp=3"])
    with pytest.raises(ConfigError, match=r"'evaluation.settings.parallel.tp': num_heads=4 is not divisible by tp=3"):
        validate(r, demo_data)
    r = load_config(TrainRecipe, repo / "configs/train/bloom-tiny.yaml", ["evaluation.settings.parallel.tp=2"])
    validate(r, demo_data)
