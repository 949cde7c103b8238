"""The `bloomline` CLI: misuse gives one-line errors; the real Prefect flow runs end to end,
and a run killed with SIGKILL resumes to byte-identical output."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BLOOMLINE = [sys.executable, "-m", "flows.cli"]


def cli(*args, timeout=600, **kw):
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run([*BLOOMLINE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env={**env, **kw.pop("env", {})}, **kw)


def one_line_error(res, pattern):
    assert res.returncode == 2, res.stderr
    lines = [l for l in res.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert pattern in lines[0], lines[0]


def test_misuse_gives_one_line_errors(tmp_path):
    one_line_error(cli("prepare", "--out", tmp_path / "o", tmp_path / "missing.jsonl"), "input not found")
    bad_cfg = tmp_path / "c.yaml"
    bad_cfg.write_text("dedup:\n  treshold: 0.5\n")
    one_line_error(cli("prepare", "--config", bad_cfg, "--out", tmp_path / "o"), "did you mean 'threshold'")
    one_line_error(cli("prepare", "--out", tmp_path / "o", "-o", "pack.buckets=[512,64]"), "pack.buckets")
    one_line_error(cli("prepare", "--config", tmp_path / "nope.yaml", "--out", tmp_path / "o"), "config file not found")
    unreadable = tmp_path / "x.parquet"
    unreadable.write_text("not parquet")
    res = cli("prepare", "--out", tmp_path / "o", unreadable)
    assert res.returncode == 2 and "error:" in res.stderr and "x.parquet" in res.stderr


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run_stats.json" and ".work" not in p.parts}


@pytest.mark.slow
def test_prepare_end_to_end_and_resume_after_kill(tmp_path, bad_inputs):
    bad = tmp_path / "bad.jsonl"
    bad_inputs(bad)
    args = ["prepare", "--out", None, REPO / "data_prep/sample_corpus", bad, "-o", "pack.part_bytes=4096",
            "-o", "dask.n_workers=2"]

    # 1. uninterrupted reference run through the real Prefect flow and Dask
    ref = tmp_path / "ref"
    prefect_home = tmp_path / "prefect-home"
    res = cli(*[a if a is not None else ref for a in args], env={"PREFECT_HOME": str(prefect_home)})
    assert res.returncode == 0, res.stderr[-3000:]
    # the per-language table reached Prefect as a table artifact
    import sqlite3

    with sqlite3.connect(prefect_home / "prefect.db") as db:
        rows = list(db.execute("select type, data from artifact where key = 'prepare-summary'"))
    assert rows and rows[0][0] == "table"
    table = json.loads(json.loads(rows[0][1]))
    assert {r["lang"] for r in table} >= {"en", "sw", "code-python"}
    assert "per-language summary" in res.stderr and "done" in res.stderr
    m = json.loads((ref / "manifest.json").read_text())
    assert m["totals"]["input_records"] == m["totals"]["docs_in"]
    assert m["languages"]["_unknown"]["errors"]["malformed_json"] == 1

    # 2. the same command, SIGKILLed twice (during read/filter and during packing), then rerun
    out = tmp_path / "killed"
    cmd = [*BLOOMLINE, *map(str, [a if a is not None else out for a in args])]
    for marker_glob in ("chunks/c*.json", "parts/*.json"):
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if list((out / ".work").glob(marker_glob)):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job: CLI, Dask workers, Prefect server
        proc.wait()
        assert not (out / "manifest.json").exists()
    res = cli(*[a if a is not None else out for a in args])
    assert res.returncode == 0, res.stderr[-3000:]
    assert tree_bytes(out) == tree_bytes(ref)
    assert not list(out.rglob("*.tmp-*"))

    # 3. once more: nothing to do
    res = cli(*[a if a is not None else out for a in args])
    assert res.returncode == 0 and "already complete" in res.stderr


@pytest.mark.slow
def test_strict_fails_fast(tmp_path, bad_inputs):
    bad = tmp_path / "bad.jsonl"
    bad_inputs(bad)
    res = cli("prepare", "--strict", "--out", tmp_path / "o", bad)
    assert res.returncode == 2
    assert "bad.jsonl:2: malformed_json" in res.stderr
