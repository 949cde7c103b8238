"""What prepared data is made from (data_prep/config/ PrepareConfig.identity): the one
definition behind ``bloomline prepare``'s fingerprint and the main job's prepare key."""

import shutil

import pytest

from bloomline.errors import DataError
from data_prep.config import PrepareConfig, SourceConfig


def identity(*sources, **settings):
    return PrepareConfig(sources=[SourceConfig(path=str(p), lang=lang) for p, lang in sources], **settings).identity()


def test_each_sources_bytes_count_in_order_not_its_path(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"text": "A"}\n')
    b.write_text('{"text": "B"}\n')
    base = identity((a, "en"), (b, "fr"))
    assert identity((b, "en"), (a, "fr")) != base  # paths swapped: each language's options now read other bytes
    assert identity((b, "fr"), (a, "en")) != base  # reordered: other chunk ids, another first of each duplicate
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in (a, b):
        shutil.copy(f, copy / f.name)
    assert identity((copy / "a.jsonl", "en"), (copy / "b.jsonl", "fr")) == base  # the same bytes elsewhere
    assert identity((a, "en"), (b, "fr"), memory_gib=8.0, keep_work=True) == base  # where the work runs
    assert identity((a, "en"), (b, "fr"), seed=7) != base


def test_a_missing_tokenizer_is_one_line(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text('{"text": "A"}\n')
    cfg = PrepareConfig(sources=[SourceConfig(path=str(a))])
    cfg.tokenizer.model = str(tmp_path / "nope.model")
    with pytest.raises(DataError, match="tokenizer.model .*nope.model not found"):
        cfg.identity()
