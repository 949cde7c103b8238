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


def test_relative_source_paths_resolve_against_the_recipe(tmp_path):
    (tmp_path / "sub").mkdir()
    f = tmp_path / "sub" / "c.yaml"
    f.write_text("sources:\n  - path: ../data\n")
    cfg = load_config(PrepareConfig, f)
    assert cfg.sources[0].path == str((tmp_path / "data").resolve())


def test_every_config_field_has_a_docstring():
    for name in dir(dc):
        cls = getattr(dc, name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == dc.__name__:
            docs = field_docs(cls)
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
            assert not missing, f"{name} fields without docstring: {missing}"
