"""prepare from and to the loopback S3 server (tests/support/s3.py): the same shards as a local
run, byte for byte, also after a SIGKILL during an upload; the folder's lease; one-line errors."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bloomline.errors import BloomlineError
from data_prep.pipeline import run_all
from tests.support.prepare_runs import demo_cfg

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data_prep/sample_corpus"


def local_shards(out: Path) -> dict[str, str]:
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (out / "shards").rglob("*.arrow")
    }


def store_shards(fs, url: str) -> dict[str, str]:
    root = url[len("s3://") :]
    fs.invalidate_cache()
    return {f[len(root) + 1 :]: hashlib.sha256(fs.cat_file(f)).hexdigest() for f in fs.find(f"{root}/shards")}


@pytest.fixture
def local_run(demo_data):
    """The demo's shards prepared locally (the session's demo_data), by digest."""
    return local_shards(demo_data)


@pytest.fixture
def corpus_url(s3):
    url = f"s3://{s3.bucket}/in/sample_corpus"
    if not s3.fs().exists(url):
        s3.fs().put(str(SAMPLE), url, recursive=True)
    return url


KILLED = textwrap.dedent(
    """
    import sys
    from tests.support.prepare_runs import demo_cfg
    from data_prep.pipeline import run_all
    run_all(demo_cfg(sys.argv[1]), sys.argv[2])
    """
)


def test_prepare_from_s3_to_s3_killed_during_an_upload_then_rerun_gives_the_local_run_s_shards(
    s3, corpus_url, local_run, tmp_path
):
    """Inputs, shards, manifest, drop log, work folder and markers all on the store. The job's
    process is SIGKILLed once the chunks pass has uploaded some of its files (polled on the store:
    the kill lands among the uploads of that pass); the rerun, in this process with its own
    scratch space, resumes from the markers on the store: the shards are the local run's."""
    out = f"s3://{s3.bucket}/runs/killed"
    env = {**os.environ, "BLOOMLINE_SCRATCH": str(tmp_path / "killed-scratch"), "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", KILLED, corpus_url, out], env=env, cwd=REPO)
    fs, root = s3.fs(), out[len("s3://") :]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        fs.invalidate_cache()
        if len(fs.find(f"{root}/.work/chunks")) >= 6:
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    fs.invalidate_cache()
    assert p.returncode == -signal.SIGKILL and not fs.exists(f"{out}/manifest.json")
    m = run_all(demo_cfg(corpus_url), out)
    assert m["run_stats"].get("already_complete") is None
    assert store_shards(s3.fs(), out) == local_run and len(local_run) > 100
    assert {s["path"] for s in m["shards"]} == set(local_run)
    fs.invalidate_cache()
    assert fs.exists(f"{out}/manifest.json") and not fs.exists(f"{out}/.work")  # work folder removed at the end
    assert run_all(demo_cfg(corpus_url), out)["run_stats"] == {"already_complete": True}


def test_store_errors_are_one_line_naming_the_url_never_the_secret(s3, monkeypatch, tmp_path):
    import s3fs

    with pytest.raises(BloomlineError, match=r"^s3://no-such-bucket: not found") as e:
        run_all(demo_cfg(str(SAMPLE)), "s3://no-such-bucket/run")
    assert "\n" not in str(e.value)
    with pytest.raises(BloomlineError, match=r"^input not found: s3://no-such-bucket/in$"):
        run_all(demo_cfg("s3://no-such-bucket/in"), tmp_path / "out")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3.secret)
    s3fs.S3FileSystem.clear_instance_cache()
    for source, out in ((str(SAMPLE), f"s3://{s3.bucket}/runs/denied"), (f"s3://{s3.bucket}/in", tmp_path / "o2")):
        with pytest.raises(BloomlineError, match=r"^s3://.*: access denied") as e:
            run_all(demo_cfg(source), out)
        assert s3.secret not in str(e.value) and "\n" not in str(e.value)
