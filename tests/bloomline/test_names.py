"""Names read from a file or a store stay inside their folder (bloomline/names.py): the one check,
and a hostile bucket on the loopback S3 server (a manifest naming a ``../`` shard, a mirror
holding a ``../`` object, a checkpoint whose data is that bucket) refused by every reader in one
line, with nothing written outside its folder."""

import hashlib
import json
import logging
import os

import pytest
import torch
from typer.testing import CliRunner

from bloomline.config import load_config
from bloomline.names import UnsafeName, checked_name, confined
from tests.support import REPO
from tests.support.checkpoints import one_rank_checkpoint
from training.config import TrainRecipe

ESCAPE = "shards/../../../escaped.py"  # from DataCache.local/shards: the cache's parent's parent


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "an empty name"),
        ("/etc/passwd", "an absolute path"),
        ("shards/../x", "'..' part"),
        ("..", "'..' part"),
        ("a//b", "an empty, '.' or '..' part"),
        ("./a", "an empty, '.' or '..' part"),
        ("a/\0b", "a NUL byte"),
        (None, "an empty name"),
    ],
)
def test_a_name_that_leaves_its_folder_is_refused_in_one_line(name, why):
    with pytest.raises(UnsafeName) as e:
        checked_name(name, "s3://b/run/manifest.json")
    msg = str(e.value)
    assert msg.startswith("s3://b/run/manifest.json names ") and why in msg and "\n" not in msg


def test_a_plain_name_joins_and_a_link_out_of_the_folder_is_refused(tmp_path):
    root = tmp_path / "root"
    (root / "shards").mkdir(parents=True)
    assert confined(root, "shards/en/a.arrow", "m") == root / "shards/en/a.arrow"
    (root / "shards" / "out").symlink_to(tmp_path)
    with pytest.raises(UnsafeName, match=r"resolves outside .*root \(through a symbolic link\)"):
        confined(root, "shards/out/x", "m")
    with pytest.raises(UnsafeName, match=r"^m names \"x\\nerror: fake/\", which has an empty"):
        confined(root, "x\nerror: fake/", "m")  # someone else's line break stays escaped


@pytest.fixture
def hostile_data(s3, demo_data, tmp_path, monkeypatch):
    """Prepared data at an S3 URL whose manifest names a shard outside the folder, its sha256 the
    attacker's object's (the attacker wrote both)."""
    url = f"s3://{s3.bucket}/hostile/{tmp_path.name}"
    fs = s3.fs()
    fs.put(str(demo_data), url, recursive=True)
    payload = b"print('owned')\n"
    fs.pipe_file(f"{url}/{ESCAPE}", payload)
    m = json.loads((demo_data / "manifest.json").read_text())
    shard = next(s for s in m["shards"] if s["split"] == "train")
    shard.update(path=ESCAPE, sha256=hashlib.sha256(payload).hexdigest())
    fs.pipe_file(f"{url}/manifest.json", json.dumps(m).encode())
    monkeypatch.setenv("BLOOMLINE_DATA_CACHE", str(tmp_path / "cache" / "data"))
    from data_prep.storage.data_cache import DataCache

    monkeypatch.setattr(DataCache, "_open", {})
    return url


def escaped(tmp_path) -> list:
    return [p for p in tmp_path.rglob("escaped.py")]


def test_train_export_and_the_dashboard_refuse_a_manifest_naming_a_shard_outside(hostile_data, tmp_path, demo_data):
    from flows.cli.app import app
    from flows.stages.train_job import validate
    from training.data.shard_reader import ShardIndex

    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    with pytest.raises(UnsafeName, match=rf"^{hostile_data}/manifest.json names \"{ESCAPE}\", which has"):
        validate(recipe, hostile_data)  # what 'bloomline train --data URL' checks before any rank starts
    with pytest.raises(UnsafeName):
        ShardIndex(hostile_data, "train")
    # a checkpoint whose bloomline.json names that bucket as its data: export and the dashboard
    run = tmp_path / "run"
    step = one_rank_checkpoint(run / "checkpoints" / "step_1", {"w": torch.zeros(2)}, recipe, demo_data)
    meta = json.loads((step / "bloomline.json").read_text())
    (step / "bloomline.json").write_text(json.dumps({**meta, "data_dir": hostile_data}))
    (run / "checkpoints" / "latest").write_text("step_1")
    from eval.pages.dashboard import _manifest

    with pytest.raises(UnsafeName):
        _manifest(run)
    res = CliRunner().invoke(app, ["dashboard", str(run)])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "names" in lines[0] and ESCAPE in lines[0], res.stderr
    assert escaped(tmp_path) == []


@pytest.fixture
def hostile_mirror(s3, demo_data, tmp_path):
    """A checkpoint mirror holding a real checkpoint and an object named to land outside it."""
    from training.checkpoint.mirror import upload_checkpoint
    from training.checkpoint.run_dir import RunDir

    url = f"s3://{s3.bucket}/hostile-mirror/{tmp_path.name}"
    run = RunDir(tmp_path / "source")
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml")
    one_rank_checkpoint(run.step_dir(1), {"w": torch.zeros(2)}, recipe, demo_data)
    run.latest_file.write_text("step_1")
    upload_checkpoint(run, 1, url, keep=2)
    s3.fs().pipe_file(f"{url}/checkpoints/step_1/../../../../escaped.py", b"print('owned')\n")
    return url


def test_a_checkpoint_url_and_a_resume_refuse_a_mirror_object_named_outside(hostile_mirror, tmp_path, monkeypatch):
    from flows.cli.app import app
    from flows.stages.train import open_run
    from training.checkpoint.mirror import checkpoint_at, fetch_checkpoint

    monkeypatch.setenv("BLOOMLINE_SCRATCH", str(tmp_path / "scratch"))  # where a checkpoint URL's copy goes
    where = f"{hostile_mirror}/checkpoints/step_1"
    with pytest.raises(UnsafeName, match=rf"^{where} names \"../../../../escaped.py\""):
        fetch_checkpoint(where, tmp_path / "cache")
    with pytest.raises(UnsafeName):
        checkpoint_at(where)  # what 'bloomline evaluate --checkpoint URL' reads it through
    recipe = load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", [f"checkpoint.mirror={hostile_mirror}"])
    with pytest.raises(UnsafeName):
        open_run(recipe, tmp_path / "fresh", None, logging.getLogger("test"))  # a resume from the mirror
    for args in (["export", "--checkpoint", where, "--out", str(tmp_path / "hf")],):
        res = CliRunner().invoke(app, args)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and "escaped.py" in lines[0], res.stderr
    assert escaped(tmp_path) == []
    assert not os.path.exists(tmp_path / "hf")


def test_a_prepare_mirror_refuses_an_object_named_outside(s3, tmp_path, monkeypatch):
    from bloomline.mirror import Mirror

    monkeypatch.setenv("BLOOMLINE_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setattr(Mirror, "_open", {})
    url = f"s3://{s3.bucket}/hostile-out/{tmp_path.name}"
    s3.fs().pipe_file(f"{url}/scores/../../../../../escaped.py", b"x")
    m = Mirror.of(url)
    with pytest.raises(UnsafeName, match=rf"^{url}/scores names \"scores/\.\./"):
        m.fetch_tree(m.local / "scores")
    assert escaped(tmp_path) == []


def test_an_hf_index_and_a_grown_tokenizer_name_files_inside_their_folder(hf_bloom, tmp_path):
    import shutil

    from training.hf.from_hf import extension_file, open_source

    folder = tmp_path / "hf"
    shutil.copytree(hf_bloom / "model", folder)
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {k: "../" + v for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    for f in folder.glob("*.safetensors"):
        shutil.copy(f, tmp_path / f.name)  # the files it names exist, outside the folder
    with pytest.raises(UnsafeName, match=r"model.safetensors.index.json names \"\.\./"):
        open_source(str(folder))
    with pytest.raises(UnsafeName, match=r"tokenizer.extends.file\) names \"/etc/passwd\""):
        extension_file(tmp_path, {"file": "/etc/passwd"})
