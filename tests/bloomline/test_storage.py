"""A URL that carries credentials is refused wherever one is given (bloomline/storage.py): on the
command line before any process starts (so none has it in its ``/proc/*/cmdline``), in a recipe,
and at the door to every store."""

import psutil
import pytest
from typer.testing import CliRunner

from bloomline.config import load_config
from bloomline.errors import BloomlineError
from bloomline.storage import StorageError, filesystem, has_user_part
from tests.support import REPO
from training.config import TrainRecipe

SECRET = "wJalrXUtnFEMIK7MDENG"
URL = f"s3://AKIAEXAMPLE:{SECRET}@corpora/run"


def test_user_parts_are_told_from_at_signs_in_paths():
    assert has_user_part(URL) and has_user_part("https://hf_abcdefghijklmnopqrst@huggingface.co/x")
    assert has_user_part("https://h/x.jsonl?X-Amz-Signature=abc")  # a presigned URL is a credential too
    for url in ("s3://corpora/run", "s3://corpora/a@b/c", "tcp://host:8786", "hf://datasets/a/b", "/x/y@z"):
        assert not has_user_part(url), url


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--data", URL, "--out", "{tmp}/r"],
        ["prepare", "--out", URL],
        ["prepare", URL, "--out", "{tmp}/p"],
        ["evaluate", "--checkpoint", f"{URL}/checkpoints/step_1", "--data", "{tmp}", "--out", "{tmp}/e"],
        ["export", "--checkpoint", f"{URL}/checkpoints/step_1", "--out", "{tmp}/x"],
        ["train", "--data", "{tmp}", "--out", "{tmp}/r", "-o", f"checkpoint.mirror={URL}"],
        ["train", "--data", "{tmp}", "--out", "{tmp}/r", "-o", f"train.init_from={URL}"],
        ["evaluate", "--checkpoint", "{tmp}", "--data", URL, "--out", "{tmp}/e"],
        ["evaluate", "--model", "{tmp}", "--text", URL, "--out", "{tmp}/e"],
        ["export", "--checkpoint", "{tmp}", "--data", URL, "--out", "{tmp}/x"],
        ["filters", URL],
    ],
    ids=[
        "train-data",
        "prepare-out",
        "prepare-input",
        "evaluate",
        "export",
        "mirror",
        "init_from",
        "evaluate-data",
        "evaluate-text",
        "export-data",
        "filters",
    ],
)
def test_a_credentialed_url_is_refused_in_one_line_before_anything_starts(args, tmp_path):
    from flows.cli.app import app

    res = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert "a URL with a user or password is refused" in lines[0] and SECRET not in res.stderr + res.stdout
    assert not [p.pid for p in psutil.process_iter() if SECRET in " ".join(_cmdline(p))]  # in no process's argv
    assert not any(tmp_path.iterdir())


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def test_recipes_and_the_store_door_refuse_one_too():
    with pytest.raises(BloomlineError, match="'checkpoint.mirror': a URL with a user or password"):
        load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", [f"checkpoint.mirror={URL}"])
    with pytest.raises(StorageError, match=r"^a store's URL s3://AKIAEXAMPLE:\*\*\*@corpora/run: a URL with"):
        filesystem(URL)
