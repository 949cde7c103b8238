"""The `bloomline` CLI: misuse gives one-line errors; the real Prefect flow runs end to end,
and a run killed with SIGKILL resumes to byte-identical output."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import BLOOMLINE, cli
from tests.support.prepare_runs import tree_bytes

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs/data/demo.yaml"


def one_line_error(res, pattern):
    assert res.returncode == 2, res.stderr
    lines = [l for l in res.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert pattern in lines[0], lines[0]


@pytest.mark.parametrize(
    "command, code",
    [("raise typer.Exit(3)", 3), ("pass", 0), ("raise RuntimeError('boom')", 1), ("sys.exit('bye')", 1)],
)
def test_the_process_ends_without_teardown_but_after_every_exit_handler(command, code):
    """main() ends the process with os._exit after the other exit handlers ran (a handler
    registered later still runs; the streams are flushed), and with the command's exit code."""
    script = f"""
import atexit, sys, typer
from flows.cli import app as cli
class Torn:
    def __del__(self):
        sys.stderr.write("torn down")
torn = Torn()  # its __del__ runs in the interpreter's teardown only
app = typer.Typer()
@app.command()
def go():
    atexit.register(lambda: print("handler ran", flush=False))
    print("output", end="")
    sys.stderr.write("partial line")
    {command}
cli.app = app
cli.main()
print("not reached")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # so that flushing matters
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert res.returncode == code, res.stderr
    assert res.stdout == "outputhandler ran\n", res.stdout
    assert res.stderr.startswith("partial line") and "torn down" not in res.stderr, res.stderr


def prepare_refusal(inputs=(), config=None, overrides=()) -> str:
    """What ``bloomline prepare`` says before any server or cluster starts, checked in-process as the
    command checks it (the recipe loaded, its inputs replaced, data_prep/pipeline.py ``preflight``):
    the error's one line."""
    from bloomline.config import load_config
    from bloomline.errors import BloomlineError
    from data_prep.config import PrepareConfig, SourceConfig
    from data_prep.pipeline import preflight
    from flows.config import DEFAULT_RECIPES

    with pytest.raises(BloomlineError) as e:
        cfg = load_config(PrepareConfig, config or DEFAULT_RECIPES["data"], list(overrides))
        if inputs:
            cfg.sources = [SourceConfig(path=str(p)) for p in inputs]
        preflight(cfg)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_misuse_gives_one_line_errors(tmp_path):
    """The command once (one line, exit status 2), the other refusals in-process."""
    one_line_error(
        cli("prepare", "--out", tmp_path / "o", tmp_path / "missing.jsonl", "--config", DEMO), "input not found"
    )
    bad_cfg = tmp_path / "c.yaml"
    bad_cfg.write_text("dedup:\n  treshold: 0.5\n")
    assert "did you mean 'threshold'" in prepare_refusal(config=bad_cfg)
    assert "pack.buckets" in prepare_refusal(overrides=["pack.buckets=[512,64]"])
    assert "config file not found" in prepare_refusal(config=tmp_path / "nope.yaml")
    unreadable = tmp_path / "x.parquet"
    unreadable.write_text("not parquet")
    assert "x.parquet" in prepare_refusal(inputs=[unreadable])
    # a URL for a folder written on this machine: typer made it the folder "s3:/…"; refused, nothing made
    res = cli("train", "--data", tmp_path, "--out", "s3://bucket/run")
    one_line_error(res, "--out s3://bucket/run: this folder is written on this machine; keep its checkpoints")
    assert not (REPO / "s3:").exists()


def test_a_budget_too_small_for_the_data_is_a_one_line_error(tmp_path):
    """memory_gib bounds each process: a unit of work that cannot fit stops the run before any
    work starts, naming the setting — not the kernel's OOM killer halfway through."""
    import gzip

    big = tmp_path / "big.jsonl.gz"  # one chunk (gzip is not cut) of ~80 MB of records
    line = json.dumps({"id": "x", "text": "A sentence of an ordinary English document. " * 40, "lang": "en"}) + "\n"
    with gzip.open(big, "wt", compresslevel=1) as f:
        f.write(line * (80_000_000 // len(line)))
    res = cli(
        "prepare",
        "--out",
        tmp_path / "o",
        big,
        "--config",
        DEMO,
        "-o",
        "memory_gib=0.75",
        "-o",
        "tokenizer.sample_bytes=1000000",
    )
    one_line_error(
        res,
        f"input {big}, read as one chunk of about 76 MiB of records (its trailer, agreeing with a "
        f"decompressed prefix), needs about 0.60 GiB, "
        f"more than memory_gib=0.75 leaves a task",
    )
    assert "split the file, or raise memory_gib" in res.stderr
    over = ["memory_gib=1.0", "tokenizer.kind=byte_bpe", "tokenizer.sample_bytes=60000000"]
    said = "training the tokenizer on a sample of 60,000,000 bytes (tokenizer.sample_bytes, or the corpus when smaller)"
    assert f"{said} needs about 1.7" in prepare_refusal(overrides=over, inputs=[big])
    # the sample is no larger than the corpus: the 1 MB sample corpus trains in any budget
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig
    from data_prep.pipeline import preflight

    preflight(
        load_config(
            PrepareConfig, DEMO, ["memory_gib=0.75", "tokenizer.kind=byte_bpe", "tokenizer.sample_bytes=200000000"]
        )
    )
    assert "memory_gib" in prepare_refusal(overrides=["memory_gib=0.5"])
    assert not (tmp_path / "o" / ".work").exists()


@pytest.mark.slow
def test_prepare_of_another_corpus_without_a_recipe_names_the_two_recipes(tmp_path):
    """The demo recipe's sizes would shape a real corpus without a word: without --config, only the
    bundled sample is prepared (in-process)."""
    from typer.testing import CliRunner

    from flows.cli.app import app

    (tmp_path / "mine.jsonl").write_text(json.dumps({"id": "1", "text": "Merhaba dünya", "lang": "tr"}) + "\n")
    for given in (tmp_path / "mine.jsonl", "s3://corpora/mine"):
        res = CliRunner().invoke(
            app, ["prepare", "--out", str(tmp_path / "o"), str(REPO / "data_prep/sample_corpus"), str(given)]
        )
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, res.stderr
        assert lines[0] == (
            f"error: {given} is not the bundled sample: choose a recipe, --config configs/data/bloom.yaml "
            "(BLOOM's sizes: real work) or --config configs/data/demo.yaml (the sample's small sizes: a quick try)"
        )
    assert not (tmp_path / "o").exists()


def test_prepare_end_to_end_and_resume_after_kill(tmp_path, bad_inputs):
    bad = tmp_path / "bad.jsonl"
    bad_inputs(bad)
    args = [
        "prepare",
        "--out",
        None,
        REPO / "data_prep/sample_corpus",
        bad,
        "--config",
        DEMO,
        "-o",
        "pack.part_bytes=4096",
        "-o",
        "dask.n_workers=2",
    ]

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
    with sqlite3.connect(prefect_home / "prefect.db") as db:
        report = list(db.execute("select type, data from artifact where key = 'filter-report'"))
    assert report and report[0][0] == "markdown" and "Drops by language and reason" in json.loads(report[0][1])
    table = json.loads(json.loads(rows[0][1]))
    assert {r["lang"] for r in table} >= {"en", "sw", "code-python"}
    assert "per-language summary" in res.stderr and "done" in res.stderr
    m = json.loads((ref / "manifest.json").read_text())
    # the recipe in force, said when the run starts and kept with the data
    said = f"{DEMO}: a sentencepiece tokenizer of 4,000 trained; buckets [64, 128, 256, 512]; thresholds fitted for 46"
    assert m["recipe"]["file"] == str(DEMO) and m["recipe"]["summary"].startswith(said), m["recipe"]
    assert "recipe " + said in " ".join(res.stderr.split()), res.stderr[:2000]
    # every input record is booked: counted here from the files themselves, not from the manifest
    # (JSONL records end at b"\n" only: the junk line holds other line-break bytes)
    records = sum(
        1
        for f in [*(REPO / "data_prep/sample_corpus").rglob("*.jsonl"), bad]
        for l in f.read_bytes().split(b"\n")
        if l.strip()
    )
    assert m["totals"]["input_records"] == m["totals"]["docs_in"] == records
    assert m["languages"]["_unknown"]["errors"]["malformed_json"] == 1

    # 2. the same command, SIGKILLed twice (during read/filter and during packing), then rerun
    out = tmp_path / "killed"
    cmd = [*BLOOMLINE, *map(str, [a if a is not None else out for a in args])]
    for marker_glob in ("chunks/c*.json", "parts/*.json"):
        sems_before = set(Path("/dev/shm").glob("sem.mp-*"))
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if list((out / ".work").glob(marker_glob)):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job: CLI, Dask workers, Prefect server
        proc.wait()
        # A SIGKILLed job's Python multiprocessing semaphores (Dask's) outlive it in /dev/shm: its
        # resource tracker died with it. Only this job made them while it ran, so they go.
        for sem in set(Path("/dev/shm").glob("sem.mp-*")) - sems_before:
            sem.unlink(missing_ok=True)
        assert not (out / "manifest.json").exists()
    res = cli(*[a if a is not None else out for a in args])
    assert res.returncode == 0, res.stderr[-3000:]
    assert tree_bytes(out) == tree_bytes(ref)
    assert not list(out.rglob("*.tmp-*"))

    # 3. once more: nothing to do
    res = cli(*[a if a is not None else out for a in args])
    assert res.returncode == 0 and "already complete" in res.stderr


@pytest.mark.slow
def test_dedup_is_the_same_on_one_worker_or_two_and_after_a_kill_during_it(tmp_path, dup_inputs):
    """A corpus with hundreds of exact and near copies: one worker and two give the same bytes,
    and so does a run SIGKILLed while its dedup pass runs (the dedup job's first files are on
    disk, the stage's marker is not), then run again."""
    args = ["prepare", "--out", None, dup_inputs, "--config", DEMO, "-o", "keep_work=true"]
    one = tmp_path / "one"
    res = cli(*[a if a is not None else one for a in args], "-o", "dask.n_workers=1")
    assert res.returncode == 0, res.stderr[-3000:]
    dups = json.loads((one / "manifest.json").read_text())["stages"]["dedup"]["duplicates"]
    assert dups["exact"] > 50 and dups["near"] > 50
    out = tmp_path / "two"
    cmd = [*BLOOMLINE, *map(str, [a if a is not None else out for a in args]), "-o", "dask.n_workers=2"]
    sems_before = set(Path("/dev/shm").glob("sem.mp-*"))
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while (
        time.time() < deadline and proc.poll() is None and not list((out / ".work" / "dedup").glob("exact-keys/*.json"))
    ):
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for sem in set(Path("/dev/shm").glob("sem.mp-*")) - sems_before:
        sem.unlink(missing_ok=True)
    assert not (out / ".work" / "dedup.json").exists(), "killed too late: the dedup pass had finished"
    res = cli(*cmd[len(BLOOMLINE) :])
    assert res.returncode == 0, res.stderr[-3000:]
    assert tree_bytes(out) == tree_bytes(one)


@pytest.mark.slow
def test_strict_fails_fast(tmp_path, bad_inputs):
    bad = tmp_path / "bad.jsonl"
    bad_inputs(bad)
    res = cli("prepare", "--strict", "--out", tmp_path / "o", bad, "--config", DEMO)
    assert res.returncode == 2
    assert "bad.jsonl:2: malformed_json" in res.stderr


def train_refusal(data, *overrides) -> str:
    """What ``bloomline train`` says of a recipe, checked in-process as the command checks it before
    any rank starts (load, then flows/stages/train_job.py ``validate``): the error's one line."""
    from bloomline.config import load_config
    from bloomline.errors import BloomlineError
    from flows.config import DEFAULT_RECIPES
    from flows.stages.train_job import validate
    from training.config import TrainRecipe

    with pytest.raises(BloomlineError) as e:
        validate(load_config(TrainRecipe, DEFAULT_RECIPES["train"], list(overrides)), data)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (["model.vocab_size=5000"], "tokenized with a 4000-piece tokenizer"),
        (["parallel.pp=2", "parallel.zero_stage=3"], "cannot be combined with pipeline parallelism"),
        (["model.seq_len=256"], "longer than the model's seq_len 256"),
        (["train.precision=fp16"], "fp16 needs GPUs"),
        # UniMax's cap: 0.001 epochs of the demo data cannot hold bloom-tiny's 30 steps
        (
            ["batch.blend.rule=unimax", "batch.blend.max_epochs=0.001"],
            "'batch.blend.max_epochs': 0.001 epochs of every language hold",
        ),
        (["batch.mixture=online", "batch.online.rule=doremi"], "batch.online.rule"),
        (['launch.master_addr="10.0.0.1\\nNCCL_NET_PLUGIN=/tmp/x.so"'], "is not a host name or an IP address"),
        (['launch.nccl={NCCL_DEBUG: "INFO\\nLD_PRELOAD=/tmp/x.so"}'], "NCCL_DEBUG: a value holds a line break"),
        (
            ["batch.mixture=online", "batch.online.min_weight=0.05"],
            "'batch.online.min_weight': 59 languages × min_weight 0.05 = 2.95 > 1",
        ),
        (
            ["batch.mixture=online", "batch.online.rule=evaluation", "evaluation.enabled=false"],
            "it needs evaluation.enabled=true",
        ),
        (
            ["batch.mixture=online", "batch.online.rule=evaluation", "batch.online.reference=/nowhere/run"],
            "has no evaluation results",
        ),
    ],
    ids=lambda x: x[-1] if isinstance(x, list) else None,
)
def test_train_refuses_bad_configuration(demo_data, overrides, pattern):
    assert pattern in train_refusal(demo_data, *overrides)


def test_train_refuses_bad_configuration_before_any_rank_starts(demo_data, tmp_path):
    """The command itself, once: one line, exit status 2, no run folder (no rank, no launcher, no log)."""
    one_line_error(
        cli("train", "--data", demo_data, "--out", tmp_path / "r", "-o", "parallel.tp=3"),
        "num_heads=4 is not divisible by tp=3",
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_train_flow_stops_at_once_on_a_user_error(demo_data, tmp_path):
    """A corrupt shard makes the ranks exit with the user-error status: the flow stops after the
    first attempt (no restart could help) and prints the ranks' message on one line."""
    data = tmp_path / "data"
    shutil.copytree(demo_data, data)
    victim = (
        data
        / [s for s in json.loads((data / "manifest.json").read_text())["shards"] if s["split"] == "train"][0]["path"]
    )
    blob = bytearray(victim.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    victim.write_bytes(bytes(blob))
    out = tmp_path / "run"
    # with a temporary server of its own, as a user's command: checked below
    res = cli(
        "train", "--data", data, "--out", out, "-o", "checkpoint.max_restarts=2", env={"PREFECT_HOME": tmp_path / "p"}
    )
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [l for l in res.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: training stopped: shard {victim} is corrupt"), errors
    assert [p.name for p in (out / "logs").glob("run-*/attempt-*.log")] == ["attempt-1.log"]
    # one Prefect server, the one started before Prefect was imported (flows/run/api_server.py): Prefect
    # starts (and announces) a temporary server of its own when it was imported first
    assert "Starting temporary server" not in res.stdout + res.stderr


@pytest.mark.slow
def test_train_flow_restarts_after_a_rank_is_killed(demo_data, tmp_path, s3):
    """SIGKILL one rank of a PP=2 job after its first checkpoint: the flow restarts the job from
    `latest` and the run completes, every step logged once. Its checkpoints are mirrored to S3
    (checkpoint.mirror), the last before the flow reports done."""
    import psutil

    out = tmp_path / "run"
    shm = lambda: set(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*"))  # noqa: E731
    shm_before = shm()
    cmd = [
        *BLOOMLINE,
        "train",
        "--data",
        str(demo_data),
        "--out",
        str(out),
        "-o",
        "parallel.pp=2",
        "-o",
        "train.steps=6",
        "-o",
        "checkpoint.interval=2",
        "-o",
        "optim.decay_steps=30",
        "-o",
        f"checkpoint.mirror=s3://{s3.bucket}/mirrors/restarts",
        "-o",
        "evaluation.enabled=false",  # what is checked here is the restart and the mirror
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    killed = False
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and not killed:
        if (out / "checkpoints" / "latest").exists():
            for p in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if "training/loop/main.py" in " ".join(p.cmdline()) and "--local_rank=1" in p.cmdline():
                        p.kill()
                        killed = True
                except psutil.Error:
                    pass
        time.sleep(0.05)
    assert killed, "no rank found to kill"
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    assert "done: step 6/6" in output and "2 attempt(s)" in output
    # DeepSpeed's CPU all-reduce buffers (RAM in /dev/shm) of both attempts, the killed one too, are released
    assert shm() <= shm_before
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert list((out / "logs").glob("run-*/attempt-2.log"))
    fs = s3.fs()
    assert fs.cat_file(f"{s3.bucket}/mirrors/restarts/checkpoints/latest") == b"step_6"
    mirrored = sorted(s.rsplit("/", 1)[1] for s in fs.ls(f"{s3.bucket}/mirrors/restarts/checkpoints"))
    assert "step_6" in mirrored and len(mirrored) <= 3  # latest and the newest checkpoint.keep (2: the recipe's)


def test_evaluate_on_a_gpu_this_machine_lacks_is_a_one_line_error(demo_data, tmp_path):
    """device=cuda without a GPU: refused by the command itself, before the flow runs (no Prefect
    log line, no results), though the checkpoint and the data are fine."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from bloomline.config import load_config
    from data_prep.storage.shards import manifest_sha256
    from tests.support.checkpoints import write_checkpoint
    from training.config import TrainRecipe
    from training.model.bloom import Bloom

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    ckpt = tmp_path / "run" / "checkpoints" / "step_4"
    meta = write_checkpoint(ckpt, r, Bloom(r.model, seed=1))
    (ckpt / "bloomline.json").write_text(json.dumps({**meta, "data_manifest_sha256": manifest_sha256(demo_data)}))
    res = cli("evaluate", "--checkpoint", ckpt, "--data", demo_data, "-o", "device=cuda")
    one_line_error(res, "config key 'device': cuda, but torch sees no GPU on this machine")
    assert not (tmp_path / "run" / "eval").exists()


@pytest.mark.slow
def test_evaluate_publishes_results_tensorboard_and_artifacts_and_refuses_bad_checkpoints(demo_data, tmp_path):
    """Two checkpoints of a real (1-rank) training run evaluated through the real Prefect flow:
    results for both in RUN_DIR/eval, re-evaluation replaces rows, TensorBoard gets the
    per-language scalars, Prefect the table and markdown artifacts; bad checkpoints are refused."""
    import sqlite3

    import torch

    from bloomline.config import load_config, to_dict
    from eval.results.rows import validation_rows
    from eval.results.table import read_results
    from tests.support.checkpoints import Planted
    from training.config import TrainRecipe
    from training.loop.launch import launch_command, run_job

    run = tmp_path / "run"
    run.mkdir()
    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["train.steps=4", "checkpoint.interval=2"])
    (run / "recipe.json").write_text(json.dumps(to_dict(r)))
    rc = run_job(
        launch_command(run / "recipe.json", demo_data, run, 1),
        run / "train.log",
        {**os.environ, "DS_ACCELERATOR": "cpu"},
        timeout=300,
        cwd=REPO,
    )
    assert rc == 0, (run / "train.log").read_text()[-3000:]
    home = {"PREFECT_HOME": str(tmp_path / "prefect-home")}
    # a local task whose id file breaks at line 2: an error naming it, and every other task and language still run
    items = tmp_path / "xcopa"
    items.mkdir()
    rec = {
        "premise": "Mtu alianguka chini.",
        "choice1": "Aliteleza",
        "choice2": "Alicheka",
        "question": "cause",
        "label": 0,
    }
    (items / "sw.jsonl").write_text((json.dumps(rec) + "\n") * 3)
    (items / "id.jsonl").write_text(json.dumps(rec) + "\n" + '{"premise": "x",\n')
    tasks = f"tasks=[{{name: continuation, limit: 4}}, {{name: xcopa, data: {items}}}]"
    # step 4 twice: its rows are replaced, not duplicated; the last run's artifacts read from its own
    # Prefect home. The first two run the validation split alone (the demo pipeline's test checks the
    # default tasks), with no generations
    alone = ["-o", "tasks=[]", "-o", "prompts_per_lang=0"]
    for step, more, env in ((2, alone, {}), (4, alone, {}), (4, ["-o", tasks], home)):
        res = cli(
            "evaluate",
            "--checkpoint",
            run / "checkpoints" / f"step_{step}",
            "--data",
            demo_data,
            "-o",
            "max_tokens_per_lang=300",
            *more,
            env=env,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"done: step {step}" in res.stdout + res.stderr
    assert f"error: xcopa id not evaluated, malformed record: {items / 'id.jsonl'}:2: not a JSON record" in res.stderr
    long = read_results(run).to_pylist()
    assert {(x["task"], x["metric"]) for x in long if x["step"] == 4 and x["lang"] == "sw"} >= {
        ("validation", "bpb"),
        ("continuation", "acc"),
        ("xcopa", "acc"),
        ("xcopa", "acc_bytes"),
    }
    assert [x["note"] for x in long if x["task"] == "xcopa" and x["lang"] == "id"][0].startswith("malformed record")
    t = validation_rows(read_results(run))
    langs = {x["lang"] for x in t if x["scope"] == "language"}
    assert len(langs) > 50 and sorted({x["step"] for x in t}) == [2, 4]
    assert len([x for x in t if x["step"] == 4 and x["lang"] == "sw"]) == 1
    sw4 = next(x for x in t if x["step"] == 4 and x["lang"] == "sw")
    assert 0 < sw4["bpb"] < 20 and sw4["tokens_seen"] > 0 and sw4["precision"] == "fp32"
    device = "cuda" if torch.cuda.is_available() else "cpu"  # device: auto
    assert {x["eval_layout"] for x in long} == {f"tp=1 pp=1 device={device}"}
    assert list((run / "tensorboard").glob("*.eval"))
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        kinds = {k: t_ for k, t_ in db.execute("select key, type from artifact")}
    assert kinds.get("evaluation-run") == "table" and kinds.get("evaluation-summary-run") == "markdown"
    # refused, one line, before any server starts: the command once, the other refusals in-process
    (tmp_path / "half").mkdir()
    one_line_error(cli("evaluate", "--checkpoint", tmp_path / "half", "--data", demo_data), "bloomline.json not found")
    other = tmp_path / "other-data"
    shutil.copytree(demo_data, other)
    m = json.loads((other / "manifest.json").read_text())
    m["seed"] = 1
    (other / "manifest.json").write_text(json.dumps(m))
    assert "was trained on other data" in evaluate_refusal(run / "checkpoints" / "step_4", other)
    # a planted model-state pickle: refused in one line by evaluate and export, and its code never runs
    planted = tmp_path / "planted" / "checkpoints" / "step_4"
    shutil.copytree(run / "checkpoints" / "step_4", planted)
    f, marker = planted / "mp_rank_00_model_states.pt", tmp_path / "ran"
    sd = torch.load(f, weights_only=False)
    sd["rng"] = Planted(marker)
    torch.save(sd, f)
    refused = f"{f} is refused: it names posix.system"
    assert refused in evaluate_refusal(planted, demo_data)
    from bloomline.errors import BloomlineError
    from training.hf.to_hf import export

    with pytest.raises(BloomlineError, match=re.escape(refused)):
        export(planted, tmp_path / "hf", demo_data, "fp32")
    assert not marker.exists()


def evaluate_refusal(checkpoint: Path, data: Path) -> str:
    """What ``bloomline evaluate`` says of a checkpoint before its flow's server starts, checked
    in-process as the command checks it (eval/evaluate.py ``checked``, then the safe loader's
    check of every file): the error's one line."""
    from bloomline.config import load_config
    from bloomline.errors import BloomlineError
    from eval.evaluate import checked
    from flows.config import DEFAULT_RECIPES
    from training.checkpoint.safe_load import check_folder
    from training.config import EvalConfig

    with pytest.raises(BloomlineError) as e:
        checked(checkpoint, data, load_config(EvalConfig, DEFAULT_RECIPES["eval"]))
        check_folder(checkpoint)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.slow
def test_every_checkpoint_is_evaluated_while_training_runs(demo_data, tmp_path):
    """bloomline train with the automatic evaluation: a separate, lower-priority process evaluates
    every checkpoint exactly once (newest first when they queue up), checkpoint.keep=1 waits for
    the evaluations before deleting, and training's step times are logged alongside."""
    from eval.results.rows import validation_rows
    from eval.results.table import read_results, skipped_steps
    from training.checkpoint.run_dir import RunDir
    from training.data.mixture.online import read_feedback

    out = tmp_path / "run"
    res = cli(
        "train",
        "--data",
        demo_data,
        "--out",
        out,
        "-o",
        "train.steps=15",
        "-o",
        "checkpoint.interval=5",
        "-o",
        "checkpoint.keep=1",
        "-o",
        "evaluation.settings.max_tokens_per_lang=200",
        "-o",
        "evaluation.settings.prompts_per_lang=1",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "evaluated checkpoints [5, 10, 15]" in res.stdout + res.stderr
    rows = validation_rows(read_results(out))
    steps = [r["step"] for r in rows if r["scope"] == "language" and r["lang"] == "sw"]
    assert sorted(steps) == [5, 10, 15] and skipped_steps(out) == {}
    for step in (5, 10, 15):  # what an evaluation-driven mixture reads: the results table's numbers
        fb = read_feedback(RunDir(out).mixture_feedback / f"step_{step:08d}.json")
        mine = [r for r in rows if r["scope"] == "language" and r["step"] == step]
        assert fb["bpb"] == {r["lang"]: r["bpb"] for r in mine} and fb["tokens_seen"] == {
            r["lang"]: r["tokens_seen"] for r in mine
        }
        acc = [  # and, for batch.online.signal=continuation, the continuation task's accuracy and items
            r
            for r in read_results(out).to_pylist()
            if r["step"] == step and r["task"] == "continuation" and r["scope"] == "language" and r["metric"] == "acc"
        ]
        assert fb["continuation"] == {r["lang"]: r["value"] for r in acc} and len(acc) > 10
        assert fb["continuation_n"] == {r["lang"]: r["n"] for r in acc}
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_15"]  # keep=1, after evaluation
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 16)) and all(m["step_seconds"] > 0 for m in metrics)
    evaluated_at = {r["step"]: r["evaluated_at"].timestamp() for r in rows}
    end = metrics[-1]["time"]
    overlap = [s for s, t in evaluated_at.items() if t < end]
    print(f"evaluated during training: {overlap}; step seconds: {[round(m['step_seconds'], 2) for m in metrics]}")
    assert (out / "dashboard" / "index.html").is_file()
    log = next(out.glob("logs/run-*/evaluation.log")).read_text()
    done = [int(x) for x in re.findall(r"evaluated step (\d+)", log)]
    assert sorted(done) == sorted(evaluated_at) and len(set(done)) == len(
        done
    )  # each once, in whatever order they queued


@pytest.mark.slow
def test_a_held_back_evaluation_never_stalls_the_evaluation_driven_mixture(demo_data, tmp_path):
    """The mixture steers by evaluations (DoReMi's excess over a reference run, which the flow
    checks and hands to the ranks), and the evaluation process is stopped (SIGSTOP) before it
    evaluates anything: training runs every step all the same, the weights stay the start's, and
    the checkpoints left unevaluated are recorded as skipped once the drain gives up."""
    from eval.results.reference import reference_curve
    from eval.results.table import skipped_steps
    from tests.support.eval_runs import make_run
    from training.checkpoint.run_dir import RunDir
    from training.data.mixture.log import read_log
    from training.data.mixture.online import read_reference
    from training.data.shard_reader import ShardIndex, verify_once

    ref = tmp_path / "proxy"
    make_run(ref, demo_data)
    verify_once(ShardIndex(demo_data, "valid"), RunDir(ref).eval_stamp)  # the validation data its evaluations checked
    out = tmp_path / "run"
    cmd = [
        *BLOOMLINE,
        "train",
        "--data",
        str(demo_data),
        "--out",
        str(out),
        "-o",
        "train.steps=12",
        "-o",
        "checkpoint.interval=2",
        "-o",
        "batch.mixture=online",
        "-o",
        "batch.online.rule=evaluation",
        "-o",
        "batch.online.warmup_steps=0",
        "-o",
        "evaluation.drain_s=1",
        "-o",
        f"batch.online.reference={ref}",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
        start_new_session=True,
    )
    try:
        hold, deadline = RunDir(out).hold_file, time.time() + 300
        while not hold.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert hold.exists(), (proc.stdout.read() if proc.poll() is not None else "no watcher within 300 s")[-3000:]
        watcher = json.loads(hold.read_text())["pid"]
        os.kill(watcher, signal.SIGSTOP)  # the watcher announces itself before the first checkpoint exists
        assert not RunDir(out).complete_steps(), "a checkpoint was written before the watcher could be held"
        text, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, text[-3000:]
    metrics = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert [e["cause"]["rule"] for e in read_log(RunDir(out))] == ["start"]  # nothing landed, nothing waited for
    assert not list(RunDir(out).mixture_feedback.glob("*.json")) and 12 in skipped_steps(out)
    curve, checked = reference_curve(ref, demo_data, sorted(read_log(RunDir(out))[0]["weights"]))
    assert read_reference(RunDir(out)) == curve and "mixture reference: " in text  # what every rank read


@pytest.mark.slow
def test_two_nodes_on_loopback_train_checkpoint_and_resume_like_one_node(demo_data, tmp_path):
    """Two DeepSpeed launchers on this machine, --node_rank 0 and 1, 2 local ranks each, master on
    127.0.0.1, no ssh: the 4-rank job trains, checkpoints and resumes, step for step as the same
    4 ranks on one node."""
    from training.loop.launch import free_port

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=2\nnode1 slots=2\n")
    common = [
        "-o",
        "parallel.dp=4",
        "-o",
        "checkpoint.interval=2",
        "-o",
        "optim.decay_steps=30",
        "-o",
        "evaluation.enabled=false",
    ]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}

    def two_nodes(out, steps):
        port = str(free_port())
        base = [
            *BLOOMLINE,
            "train",
            "--data",
            str(demo_data),
            "--out",
            str(out),
            "--hostfile",
            str(hostfile),
            "--no-ssh",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            *common,
            "-o",
            f"train.steps={steps}",
        ]
        procs = [
            subprocess.Popen(
                [*base, "--node-rank", str(n)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            for n in (1, 0)
        ]
        try:
            outs = [p.communicate(timeout=600)[0] for p in procs]
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(o[-2500:] for o in outs)
        return outs

    two = tmp_path / "two-nodes"
    node1, node0 = two_nodes(two, 4)
    assert "node 1's ranks finished" in node1 and "done: step 4/4" in node0
    assert json.loads((two / "checkpoints" / "step_4" / "bloomline.json").read_text())["layout"]["dp"] == 4
    node1, node0 = two_nodes(two, 6)  # resumes from step 4 on both nodes
    assert "from step 4" in node0 and "done: step 6/6" in node0

    one = tmp_path / "one-node"
    res = cli("train", "--data", demo_data, "--out", one, *common, "-o", "train.steps=6")
    assert res.returncode == 0, res.stderr[-3000:]

    def loss(run):
        return [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]

    split, whole = loss(two), loss(one)
    assert [s for s, _ in split] == [s for s, _ in whole] == [1, 2, 3, 4, 5, 6]
    for (s, a), (_, b) in zip(split, whole):
        assert a == pytest.approx(b, rel=1e-3), (s, a, b)


@pytest.mark.slow
def test_prepare_on_a_dask_cluster_sharing_no_filesystem_from_and_to_s3_is_the_local_run(demo_data, tmp_path, s3):
    """A real cluster — `dask scheduler` and two `dask worker` processes on loopback, each started
    in an empty folder of its own (its working, scratch and temporary folder) — prepares the demo
    corpus from an S3 bucket to an S3 URL given --dask-address: the workers share nothing but the
    store, and every file of the output is byte for byte the local run's (the manifest less its
    input paths). The credentials, in the standard environment only, appear in no output: the
    command's, the cluster's logs, any object of the run, any file of the workers or of Prefect."""
    from distributed import Client

    dask = str(Path(sys.executable).parent / "dask")
    sched_file = tmp_path / "scheduler.json"
    source, out = f"s3://{s3.bucket}/in/cluster/sample_corpus", f"s3://{s3.bucket}/runs/cluster"
    s3.fs().put(str(REPO / "data_prep/sample_corpus"), source, recursive=True)
    homes = [tmp_path / f"worker-{i}" for i in range(2)]
    logs = [tmp_path / "scheduler.log", *(h.with_suffix(".log") for h in homes)]
    procs = [
        subprocess.Popen(
            [
                dask,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(sched_file),
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=open(logs[0], "wb"),
            start_new_session=True,
        )
    ]
    try:
        deadline = time.time() + 120
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        for home, log in zip(homes, logs[1:]):
            home.mkdir()
            procs.append(
                subprocess.Popen(
                    [
                        dask,
                        "worker",
                        "--scheduler-file",
                        str(sched_file),
                        "--nthreads",
                        "1",
                        "--no-dashboard",
                        "--host",
                        "127.0.0.1",
                        "--local-directory",
                        str(home),
                    ],
                    cwd=home,
                    env={**os.environ, "TMPDIR": str(home)},
                    stdout=subprocess.DEVNULL,
                    stderr=open(log, "wb"),
                    start_new_session=True,
                )
            )
        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            address = client.scheduler.address
            assert address.startswith("tcp://127.0.0.1:")
            res = cli(
                "prepare",
                source,
                "--config",
                DEMO,
                "--out",
                out,
                "--dask-address",
                address,
                env={"PREFECT_HOME": str(tmp_path / "prefect")},
            )
            assert res.returncode == 0, res.stderr[-3000:]
            fs, root = s3.fs(), out[len("s3://") :]
            got = {f[len(root) + 1 :]: fs.cat_file(f) for f in fs.find(root)}
            want = tree_bytes(demo_data)
            manifests = [json.loads(x.pop("manifest.json")) for x in (got, want)]
            for m in manifests:  # where the inputs were read from: the one difference
                m.pop("inputs")
                for src in m["config"]["sources"]:
                    src.pop("path")
            assert manifests[0] == manifests[1]
            got.pop("run_stats.json")
            assert got == want
            # each worker worked in its own folder, through its own copy of the run folder
            assert all(list(h.rglob("bloomline-mirrors")) for h in homes)
            # the chunks were processed by the cluster's workers, not a local cluster
            prefixes = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
            # (a graph this small takes its components in one task, not in Large/Small-Star rounds)
            for step in (
                "process_chunk",
                "exact_keys",
                "exact_groups",
                "band_keys",
                "find_pairs",
                "stars_in_one_task",
                "label_nodes",
                "decide_range",
                "sample_chunk",
                "pack_part",
            ):
                assert any(step in p for p in prefixes), (step, prefixes)
        secret = s3.secret.encode()
        assert s3.secret not in res.stdout + res.stderr
        assert not [k for k, v in got.items() if secret in v]
        assert not [p for p in tmp_path.rglob("*") if p.is_file() and secret in p.read_bytes()]
    finally:
        for p in procs:  # SIGTERM first: Dask's processes then release their semaphores in /dev/shm
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
