"""Contract 2 without ranks: bloomline.json checks, the run folder, and load_model's merging on
checkpoint folders laid out as DeepSpeed lays them out (real DeepSpeed-written checkpoints of
every layout are loaded in test_trainer_multiproc.py)."""

import json
from pathlib import Path

import pytest
import torch

from bloomline.config import load_config
from bloomline.errors import CheckpointError
from tests.support.checkpoints import Planted, write_checkpoint
from training.checkpoint.load import detect_layout, load_model
from training.checkpoint.meta import read_meta
from training.checkpoint.run_dir import RunDir, step_dir_name, step_of_dir_name
from training.config import TrainRecipe
from training.model.bloom import Bloom

REPO = Path(__file__).resolve().parents[3]


def saved_names(step_dir):
    """The parameter names TP rank 0's files hold, as Bloom names (what load_model loads)."""
    from training.checkpoint.load import _rank_weights

    return list(_rank_weights(Path(step_dir), read_meta(step_dir), 0)[0])


def recipe(*overrides):
    # 4,100 pieces: 4,224 rows at TP=1, 4,352 at TP=2, so merging must also cut the TP padding
    return load_config(TrainRecipe, REPO / "configs/train/bloom-tiny.yaml", ["model.vocab_size=4100", *overrides])


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_load_model_joins_any_layout_into_the_single_device_model(tmp_path, tp, pp):
    r = recipe(f"parallel.tp={tp}", f"parallel.pp={pp}", "parallel.zero_stage=0")
    model = Bloom(r.model, seed=9)
    write_checkpoint(tmp_path / "step_4", r, model)
    assert detect_layout(tmp_path / "step_4", r.model.num_layers)["tp"] == tp
    assert saved_names(tmp_path / "step_4") == list(model.state_dict())  # the files hold Bloom's names
    got, meta = load_model(tmp_path / "step_4", dtype=torch.bfloat16)
    assert meta["layout"]["tp"] == tp and got.embedding.word_embeddings.weight.dtype == torch.bfloat16
    assert got.embedding.word_embeddings.weight.shape[0] == r.model.padded_vocab(1) == 4224
    for (n, a), b in zip(model.state_dict().items(), got.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16), b), n


def test_drifted_replica_and_missing_files_are_refused(tmp_path):
    r = recipe("parallel.tp=2", "parallel.zero_stage=0")
    write_checkpoint(tmp_path / "step_4", r, Bloom(r.model, seed=1))
    f = tmp_path / "step_4" / "mp_rank_01_model_states.pt"
    blob = f.read_bytes()
    f.write_bytes(blob[:100])
    with pytest.raises(CheckpointError, match=r"mp_rank_01_model_states.pt is unreadable"):
        load_model(tmp_path / "step_4")
    f.write_bytes(blob)
    sd = torch.load(f)
    sd["module"]["final_ln.bias"][3] += 1e-3
    torch.save(sd, f)
    with pytest.raises(CheckpointError, match="final_ln.bias differs between TP rank 0 and TP rank 1"):
        load_model(tmp_path / "step_4")
    f.unlink()
    with pytest.raises(CheckpointError, match=r"field 'layout.tp' is 2, but .* holds model files of 1 TP rank"):
        load_model(tmp_path / "step_4")


def test_bloomline_json_is_checked_field_by_field(tmp_path):
    r = recipe("parallel.zero_stage=0")
    step = tmp_path / "step_4"
    good = write_checkpoint(step, r, Bloom(r.model))
    assert read_meta(step)["step"] == 4
    meta_file = step / "bloomline.json"

    def broken(change, pattern):
        meta = json.loads(json.dumps(good))
        change(meta)
        meta_file.write_text(json.dumps(meta))
        with pytest.raises(CheckpointError, match=pattern):
            read_meta(step)

    broken(lambda m: m.pop("format_version"), "no field 'format_version'")
    broken(lambda m: m.update(format_version=7), "field 'format_version' is 7, this bloomline reads 1 and 2")
    broken(lambda m: m.update(mixture=[0.5, 0.5]), "field 'mixture' should be null or a dict")
    # a version-1 file (before the online mixture) reads as a fixed mixture
    v1 = json.loads(json.dumps(good))
    v1["format_version"] = 1
    v1.pop("mixture")
    meta_file.write_text(json.dumps(v1))
    assert read_meta(step)["mixture"] is None
    broken(lambda m: m.pop("sampler"), "field 'sampler' is missing")
    broken(lambda m: m.update(step=5), "field 'step' is 5, the folder is step_4")
    broken(lambda m: m["layout"].update(tp=0), r"field 'layout.tp' is 0")
    broken(lambda m: m["model"].update(hidden_size="wide"), r"field 'model.hidden_size': expected an integer")
    broken(lambda m: m.update(precision="fp8"), "field 'precision' is 'fp8'")
    broken(lambda m: m["tp_rules"].pop("final_ln.bias"), "field 'tp_rules' does not list exactly")
    broken(lambda m: m.update(data_manifest_sha256="xyz"), "not a sha256")
    broken(lambda m: m["trainer"].pop("loss_ema"), r"field 'trainer' lacks \['loss_ema'\]")
    broken(lambda m: m["sampler"].pop("streams"), r"field 'sampler' lacks \['streams'\]")
    meta_file.write_text("{not json")
    with pytest.raises(CheckpointError, match="bloomline.json: not valid JSON"):
        read_meta(step)
    meta_file.unlink()
    with pytest.raises(CheckpointError, match="bloomline.json not found"):
        read_meta(step)


def test_run_folder_latest_keep_and_tags(tmp_path):
    run = RunDir(tmp_path)
    assert run.latest_step() is None and run.complete_steps() == []
    meta = {"format_version": 1}
    for step in (2, 4, 6):
        run.step_dir(step).mkdir(parents=True)
        run.publish(step, meta, keep=2)
    assert run.latest_step() == 6 and run.complete_steps() == [4, 6]
    run.step_dir(7).mkdir()  # a save killed before bloomline.json: not complete, not latest
    (run.step_dir(5)).mkdir()  # an older incomplete folder: removed at the next publish
    assert run.complete_steps() == [4, 6] and run.latest_step() == 6
    run.step_dir(8).mkdir()
    run.publish(8, meta, keep=2)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["latest", "step_6", "step_8"]
    # a job died after writing step_10's bloomline.json, before moving `latest`; the resumed run
    # redoes steps 9 and 10 from step_8 and publishes step_9 with keep=1: step_9 stays, the stale
    # future (step_10) and the old step_8 go
    run.step_dir(10).mkdir()
    (run.step_dir(10) / "bloomline.json").write_text("{}")
    run.step_dir(9).mkdir()
    run.publish(9, meta, keep=1)
    assert run.latest_step() == 9 and sorted(p.name for p in run.checkpoints.iterdir()) == ["latest", "step_9"]
    assert step_dir_name(12) == "step_12" and step_of_dir_name("step_12") == 12
    run.latest_file.write_text("global_step12")
    with pytest.raises(CheckpointError, match="'global_step12' is not a checkpoint name"):
        run.latest_step()
    run.latest_file.write_text("step_7")
    with pytest.raises(CheckpointError, match="points to step_7, which has no bloomline.json"):
        run.latest_step()


def test_the_writer_discards_the_future_a_resumed_run_redoes(tmp_path):
    """Before a run's ranks start: step folders beyond ``latest`` (saved by a job killed before it
    moved ``latest``) and incomplete ones (a killed save) go; the published ones stay."""
    run = RunDir(tmp_path)
    for step in (10, 20, 30):
        run.step_dir(step).mkdir(parents=True)
        (run.step_dir(step) / "bloomline.json").write_text("{}")
    run.step_dir(5).mkdir()  # a save killed before its bloomline.json
    run.latest_file.write_text("step_20")
    assert run.discard_unpublished() == [5, 30] and run.complete_steps() == [10, 20]


def test_a_planted_pickle_is_refused_in_one_line_and_runs_nothing(tmp_path):
    from training.checkpoint.reshard import convert
    from training.checkpoint.safe_load import check_folder

    r = recipe("parallel.zero_stage=0")
    step = tmp_path / "run" / "checkpoints" / "step_4"
    write_checkpoint(step, r, Bloom(r.model, seed=2))
    f = step / "mp_rank_00_model_states.pt"
    sd = torch.load(f)
    marker = tmp_path / "ran"
    sd["rng"] = Planted(marker)
    torch.save(sd, f)
    with pytest.raises(CheckpointError) as e:
        load_model(step)  # what bloomline evaluate and export call
    assert str(e.value) == (
        f"{f} is refused: it names posix.system, which is not a type a checkpoint holds, and loading it could "
        f"run code (training/CHECKPOINT.md, 'What is safe to load')"
    )
    # before DeepSpeed's own loaders (weights_only=False) read the folder: its universal converter,
    # zero_to_fp32, the ranks' resume (training/checkpoint/integrity.py)
    with pytest.raises(CheckpointError, match="posix.system"):
        check_folder(step)
    meta = json.loads((step / "bloomline.json").read_text())
    meta["layout"]["zero_stage"] = 1  # a layout the converter takes
    (step / "bloomline.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="posix.system"):
        convert(step, {"tp": 1, "pp": 1, "dp": 2, "zero_stage": 1})
    assert not marker.exists()
    assert not (step / "universal.tmp").exists()
    # the types DeepSpeed's states hold load as data: numpy's RNG state, its loss scaler, its enum
    import numpy as np
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from training.checkpoint.safe_load import safe_load

    state = {"rng": np.random.get_state(), "scaler": LossScaler(2.0), "zero": ZeroStageEnum(1)}
    torch.save(state, tmp_path / "ok.pt")
    back = safe_load(tmp_path / "ok.pt")
    assert (back["rng"][1] == state["rng"][1]).all() and back["scaler"].cur_scale == 2.0 and back["zero"] == 1


def test_a_damaged_latest_falls_back_to_the_newest_intact_checkpoint(tmp_path):
    from training.checkpoint.integrity import checkpoint_files, damage, file_records, newest_intact

    r = recipe("parallel.zero_stage=0", "parallel.tp=2")
    run = RunDir(tmp_path / "run")
    for step in (2, 4, 6):
        d = run.step_dir(step)
        meta = write_checkpoint(d, r, Bloom(r.model, seed=step), step=step)
        meta["files"] = file_records(d, checkpoint_files(d))
        run.publish(step, meta, keep=3)
    assert sorted(meta["files"]) == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    assert damage(run.step_dir(6)) is None and newest_intact(run, print) == 6
    # one byte changed, the size kept: the sha256 finds it
    f6 = run.step_dir(6) / "mp_rank_01_model_states.pt"
    blob = bytearray(f6.read_bytes())
    blob[-100] ^= 1
    f6.write_bytes(bytes(blob))
    assert damage(run.step_dir(6)) == f"{f6} is damaged: its sha256 differs from the one recorded when it was written"
    f4 = run.step_dir(4) / "mp_rank_00_model_states.pt"
    f4.write_bytes(f4.read_bytes()[: f4.stat().st_size // 2])  # cut in half
    said: list[str] = []
    assert newest_intact(run, said.append) == 2
    assert said == [
        f"{f6} is damaged: its sha256 differs from the one recorded when it was written; resuming from step_2, "
        f"the newest intact checkpoint (the steps after it are trained again; step_4.damaged, step_6.damaged "
        f"kept aside)"
    ]
    assert run.latest_step() == 2 and run.complete_steps() == [2] and run.discard_unpublished() == []
    assert (run.checkpoints / "step_6.damaged" / "mp_rank_01_model_states.pt").read_bytes() == bytes(blob)
    # a file that names code is no damage to fall back from: refused, whatever is older
    from training.checkpoint.safe_load import RefusedCheckpoint

    f2 = run.step_dir(2) / "mp_rank_01_model_states.pt"
    intact = f2.read_bytes()
    sd = torch.load(f2)
    sd["rng"] = Planted(tmp_path / "ran")
    torch.save(sd, f2)
    meta = json.loads((run.step_dir(2) / "bloomline.json").read_text())
    meta["files"] = file_records(run.step_dir(2), checkpoint_files(run.step_dir(2)))  # planted with its records
    (run.step_dir(2) / "bloomline.json").write_text(json.dumps(meta))
    with pytest.raises(RefusedCheckpoint, match="names posix.system"):
        newest_intact(run, said.append)
    f2.write_bytes(intact)
    (run.step_dir(2) / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError) as e:
        newest_intact(run, said.append)
    assert str(e.value).startswith(f"{run.step_dir(2) / 'mp_rank_00_model_states.pt'} is missing; no earlier")
