"""Every command that reads prepared data or text takes it at a URL as well as in a folder
(``s3://`` on a local S3 server, tests/support/s3.py): ``filters``, ``export --data``,
``evaluate --data`` and ``evaluate --text`` (of a checkpoint and of a published model); ``train --data`` is covered by the trainer's
own S3 test (tests/training/loop/test_trainer_multiproc.py). Before, each of these options was a
``Path``, and ``s3://b/x`` became the local folder ``s3:/b/x``."""

import json
import re

from typer.testing import CliRunner

from bloomline.config import load_config
from eval.results.table import read_results
from tests.support.checkpoints import one_rank_checkpoint
from tests.support.hf_bloom import REPO
from training.config import TrainRecipe
from training.model.bloom import Bloom


def invoke(*args: str):
    from flows.cli.app import app

    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.stderr[-3000:]
    return res


def test_every_command_that_reads_data_takes_its_url(s3, demo_data, hf_bloom, tmp_path, monkeypatch):
    monkeypatch.setenv("BLOOMLINE_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BLOOMLINE_SCRATCH", str(tmp_path / "scratch"))
    url = f"s3://{s3.bucket}/urls/{tmp_path.name}"
    s3.fs().put(str(demo_data), f"{url}/data", recursive=True)

    def same(text: str) -> str:  # the report names where it read from
        return re.sub(r"(s3://\S+/data|/\S+/demo-data\S*)", "DATA", text)

    local = invoke("filters", demo_data, "--lang", "sw", "--examples", "1").stdout
    assert same(invoke("filters", f"{url}/data", "--lang", "sw", "--examples", "1").stdout) == same(local)

    r = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["parallel.zero_stage=0"])
    step = one_rank_checkpoint(
        tmp_path / "run" / "checkpoints" / "step_1", Bloom(r.model, seed=3).state_dict(), r, demo_data
    )
    invoke("export", "--checkpoint", step, "--data", f"{url}/data", "--out", tmp_path / "hf")
    assert (tmp_path / "hf" / "spiece.model").read_bytes() == (demo_data / "tokenizer" / "tokenizer.model").read_bytes()

    docs = (REPO / "data_prep/sample_corpus/text/sw.jsonl").read_text(encoding="utf-8").splitlines()
    s3.fs().pipe_file(f"{url}/text/sw.jsonl", "".join(d + "\n" for d in docs[:3]).encode())
    invoke(
        "evaluate", "--checkpoint", step, "--data", f"{url}/data", "--text", f"{url}/text", "--out", tmp_path / "eval",
        "-o", "max_tokens_per_lang=300", "-o", "prompts_per_lang=0", "-o", "tasks=[]",
    )  # fmt: skip
    rows = read_results(tmp_path / "eval").to_pylist()  # the checkpoint on the text, cut by its data's tokenizer
    assert {r["step"] for r in rows} == {1} and {r["lang"] for r in rows if r["scope"] == "language"} == {"sw"}

    invoke(
        "evaluate", "--model", hf_bloom / "model", "--text", f"{url}/text", "--out", tmp_path / "published",
        "-o", "prompts_per_lang=0", "-o", "tasks=[]",
    )  # fmt: skip
    assert {r["layout"] for r in read_results(tmp_path / "published").to_pylist()} == {"hf"}
    manifest = json.loads((tmp_path / "published" / "data" / "manifest.json").read_text())
    assert {s["lang"] for s in manifest["shards"]} == {"sw"} and {s["split"] for s in manifest["shards"]} == {"valid"}
