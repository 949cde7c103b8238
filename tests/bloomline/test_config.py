import dataclasses

import pytest

from bloomline.config import apply_overrides, field_docs, from_dict, load_config
from bloomline.errors import ConfigError
from data_prep import config as dc
from data_prep.config import PrepareConfig


def test_unknown_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError) as e:
        from_dict(PrepareConfig, {"dedup": {"treshold": 0.5}})
    assert e.value.key == "dedup.treshold"
    assert "did you mean 'threshold'" in str(e.value)


def test_wrong_type_and_range_name_the_key():
    with pytest.raises(ConfigError, match="pack.buckets"):
        from_dict(PrepareConfig, {"pack": {"buckets": [512, 256]}})
    with pytest.raises(ConfigError, match="tokenizer.vocab_size.*integer"):
        from_dict(PrepareConfig, {"tokenizer": {"vocab_size": "big"}})
    with pytest.raises(ConfigError, match="dedup.threshold"):
        from_dict(PrepareConfig, {"dedup": {"threshold": 1.5}})
    with pytest.raises(ConfigError, match=r"filters.languages.en.max_char_rep"):
        from_dict(PrepareConfig, {"filters": {"languages": {"en": {"max_char_rep": "x"}}}})
    with pytest.raises(ConfigError, match=r"filters.languages.en.nope"):
        from_dict(PrepareConfig, {"filters": {"languages": {"en": {"nope": 1}}}})


def test_overrides_are_yaml_and_validated(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("pack:\n  buckets: [64, 128]\n")
    cfg = load_config(
        PrepareConfig, f, ["pack.buckets=[32,64,128]", "dedup.near=false", "tokenizer.model=null", "seed=7"]
    )
    assert cfg.pack.buckets == [32, 64, 128] and cfg.dedup.near is False and cfg.seed == 7
    with pytest.raises(ConfigError, match="seed.*integer"):
        load_config(PrepareConfig, f, ["seed=abc"])
    with pytest.raises(ConfigError, match="not of the form"):
        apply_overrides({}, ["novalue"])


def test_missing_and_invalid_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(PrepareConfig, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pack: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(PrepareConfig, bad)


def test_one_path_rule_the_recipe_s_folder_in_a_file_the_current_one_with_o(tmp_path, monkeypatch):
    """In every recipe kind, a relative path written in the file is the file's folder's; one given
    with -o is the current directory's; URLs, absolute paths and model recipe names are as given."""
    from flows.config import PipelineConfig
    from training.config import EvalConfig, TrainRecipe

    (tmp_path / "recipes").mkdir()
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    at, here = (tmp_path / "recipes").resolve(), (tmp_path / "here").resolve()
    data = at / "d.yaml"
    data.write_text(
        "sources: [{path: ../corpus}, {path: s3://b/x}, {path: /abs/y}]\n"
        "tokenizer: {model: tok.json}\ndecontaminate: {tasks: [{name: xnli, data: items}]}\n"
    )
    cfg = load_config(PrepareConfig, data)
    assert [s.path for s in cfg.sources] == [str(tmp_path / "corpus"), "s3://b/x", "/abs/y"]
    assert cfg.tokenizer.model == str(at / "tok.json") and cfg.decontaminate.tasks[0].data == str(at / "items")
    cfg = load_config(PrepareConfig, data, ["tokenizer.model=mine.json", "sources=[{path: corpus}]"])
    assert cfg.tokenizer.model == str(here / "mine.json") and cfg.sources[0].path == str(here / "corpus")

    ev = at / "e.yaml"
    ev.write_text("heldout: held\ntasks: [{name: xnli, data: xnli}]\n")
    cfg = load_config(EvalConfig, ev, ["tasks=[{name: xnli, data: xnli}, {name: continuation}]"])
    assert cfg.heldout == str(at / "held") and cfg.tasks[0].data == str(here / "xnli") and cfg.tasks[1].data is None

    train = at / "t.yaml"
    train.write_text("model: bloom-tiny\ntrain: {init_from: ../models/m}\n")
    cfg = load_config(TrainRecipe, train, ["checkpoint.mirror=s3://b/mirror"])
    assert cfg.train.init_from == str(tmp_path / "models/m") and cfg.checkpoint.mirror == "s3://b/mirror"
    assert cfg.model.hidden_size == load_config(TrainRecipe, train, ["model=bloom-tiny"]).model.hidden_size
    assert load_config(TrainRecipe, train, ["train.init_from=m"]).train.init_from == str(here / "m")

    pipe = at / "p.yaml"  # the pipeline file's own values are its folder's; its data recipe's, that recipe's
    pipe.write_text("data: {recipe: d.yaml, tokenizer: {model: ../models/m}}\ntrain: {recipe: t.yaml}\n")
    cfg = load_config(PipelineConfig, pipe, ["train.train.init_from=m"])
    assert cfg.data.tokenizer.model == str(tmp_path / "models/m") and cfg.data.sources[0].path == str(
        tmp_path / "corpus"
    )
    assert cfg.train.train.init_from == str(here / "m")
    (here / "other.yaml").write_text("model: bloom-560m\ntrain: {steps: 7}\n")  # a section's recipe with -o: here
    cfg = load_config(PipelineConfig, pipe, ["train.recipe=other.yaml"])
    assert cfg.train.model.hidden_size == 1024 and cfg.train.train.steps == 7


def test_every_config_field_has_a_docstring():
    for name in dir(dc):
        cls = getattr(dc, name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == dc.__name__:
            docs = field_docs(cls)
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
            assert not missing, f"{name} fields without docstring: {missing}"
