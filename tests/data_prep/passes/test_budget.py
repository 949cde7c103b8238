"""The tokenizer's sample is checked against memory_gib with its trainer's own appetite
(data_prep/passes/budget.py): the tokenizers BPE trainer holds about ten times what
SentencePiece's holds per byte of sample."""

import pytest

from bloomline.config import load_config
from data_prep.config import PrepareConfig
from data_prep.passes.budget import BudgetError, check_inputs
from tests.support.hf_bloom import REPO


def test_a_byte_level_sample_too_large_for_the_budget_is_refused_where_sentencepiece_s_fits(tmp_path):
    big = tmp_path / "big.jsonl"  # 250 MB on paper (sparse: the check reads sizes, not records)
    with open(big, "wb") as f:
        f.truncate(250_000_000)
    over = ["memory_gib=2", "tokenizer.sample_bytes=200000000", f"sources=[{{path: {big}}}]"]
    check_inputs(load_config(PrepareConfig, REPO / "configs/data/demo.yaml", over))  # SentencePiece: 0.84 GiB
    for how in (["tokenizer.kind=byte_bpe"], ["tokenizer.model=x.json", "tokenizer.extend_with=100"]):
        cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml", [*over, *how])
        with pytest.raises(
            BudgetError, match=r"a sample of 200,000,000 bytes .* needs about 5.69 GiB.*lower tokenizer"
        ):
            check_inputs(cfg)
    # a corpus smaller than the sample is the sample: the sample corpus trains in that budget
    check_inputs(load_config(PrepareConfig, REPO / "configs/data/demo.yaml", [*over[:2], "tokenizer.kind=byte_bpe"]))
