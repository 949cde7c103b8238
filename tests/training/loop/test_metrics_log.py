"""The one reader of ``metrics.jsonl`` (training/loop/metrics_log.py)."""

import json

from training.loop.metrics_log import read_metrics


def test_each_step_once_the_last_record_counting(tmp_path):
    """Rows a killed job wrote past its checkpoint, then the resumed run's rows for the same steps:
    each step is read once, as the resumed run recorded it, in step order; a line cut off by the
    kill is skipped, and a line still being written is left for the next read."""
    f = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 9.0}, {"step": 2, "loss": 8.0}, {"step": 3, "loss": 7.0}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "lo\n'  # killed mid-line
    text += "".join(json.dumps(r) + "\n" for r in [{"step": 3, "loss": 7.5}, {"step": 4, "loss": 6.5}])
    f.write_text(text + '{"step": 5, "loss"')  # being written
    got, offset = read_metrics(f)
    assert got == [
        {"step": 1, "loss": 9.0},
        {"step": 2, "loss": 8.0},
        {"step": 3, "loss": 7.5},
        {"step": 4, "loss": 6.5},
    ]
    assert offset == len(text.encode())
    with open(f, "a") as out:
        out.write(": 5.5}\n")
    assert read_metrics(f, offset) == ([{"step": 5, "loss": 5.5}], f.stat().st_size)
