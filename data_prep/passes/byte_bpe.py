"""BLOOM's own kind of tokenizer, made with the ``tokenizers`` library (the one that wrote BLOOM's):
training one on the sample (``tokenizer.kind: byte_bpe``), and growing an existing one with new
tokens learned on a new corpus (``tokenizer.extend_with``).

The pipeline is BLOOM-176B's ``tokenizer.json``: no normaliser; a split on BLOOM's regex (a
word with its leading space, every other character alone) then byte-level mapping with no prefix
space; byte-level decoding; ``<unk> <s> </s> <pad>`` as ids 0-3; the 256 byte symbols in the
alphabet, so every string is encodable. The PII placeholders are added tokens (not special: they
stand for their text).

Growing (:func:`extend`): a fresh tokenizer of the same pipeline is trained on the new corpus's
sample; its merges are walked in the order it learned them, and each one whose result the base
vocabulary lacks is appended, with the new token at the next free id, until ``extend_with`` are
added. Base ids, tokens and merges are unchanged; the new merges rank after the base's. Every
new token's parts exist when its merge is appended (they are base tokens, or earlier new ones), so
each new token is reachable. Beside it, ``extension.json`` records for each new token the base
ids the base tokenizer cuts it into: training initialises the new embedding row from them
(training/checkpoint/import_weights.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from bloomline.io import sha256_file, write_json_atomic
from data_prep.steps.pii import PLACEHOLDERS

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
"""BLOOM's, at ids 0-3 (data_prep/passes/tokenizer.py keeps the same ids for SentencePiece)."""
BLOOM_SPLIT = " ?[^(\\s|[.,!?…。，、।۔،])]+"
"""BLOOM's pre-tokenizer regex (bigscience/bloom tokenizer.json)."""
SPECIAL_CONFIG = dict(zip(("unk_token", "bos_token", "eos_token", "pad_token"), SPECIAL_TOKENS))
"""The special tokens as tokenizer_config.json names them."""
EXTENSION_FILE = "extension.json"
"""Beside a grown tokenizer.json: the base it grew from and each new token's base pieces."""


def _pipeline() -> Any:
    """An empty BPE tokenizer with BLOOM's pipeline (module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(BLOOM_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _lines(sample_files: list[Path]) -> Iterator[str]:
    for f in sample_files:
        with open(f, encoding="utf-8") as fh:
            yield from fh  # with its "\n": line breaks and indentation are learned too


def train_bpe(sample_files: list[Path], vocab_size: int, placeholders: bool = True) -> Any:
    """A byte-level BPE of ``vocab_size`` ids (specials and placeholders included) trained on the
    sample's lines, in order."""
    from tokenizers import AddedToken, pre_tokenizers, trainers

    tok = _pipeline()
    extra = len(PLACEHOLDERS) if placeholders else 0
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - extra,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_lines(sample_files), trainer=trainer)
    if placeholders:
        tok.add_tokens([AddedToken(p, special=False, normalized=False) for p in PLACEHOLDERS.values()])
    return tok


def hf_config(tokens: dict[str, str]) -> dict[str, Any]:
    """tokenizer_config.json for a tokenizer.json of ours: the plain fast class, which loads the
    file's pipeline as it is, and the special tokens."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "add_prefix_space": False, **tokens}


def save(tok: Any, folder: Path) -> Path:
    """``folder/tokenizer.json`` and its tokenizer_config.json; the tokenizer.json's path."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "tokenizer.json"
    out.write_text(tok.to_str(), encoding="utf-8")
    write_json_atomic(folder / "tokenizer_config.json", hf_config(SPECIAL_CONFIG))
    return out


def train_byte_bpe(sample_files: list[Path], folder: Path, vocab_size: int) -> Path:
    """The ``tokenizer.kind: byte_bpe`` tokenizer trained on the sample, saved in ``folder``."""
    return save(train_bpe(sample_files, vocab_size), folder)


def _merges(model: dict[str, Any]) -> list[tuple[str, str]]:
    """A BPE model's merges, written as pairs (tokenizers >= 0.20) or as "a b" strings (older files)."""
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]  # type: ignore[misc]


def new_merges(fresh: list[tuple[str, str]], have: set[str], n: int) -> list[tuple[str, str]]:
    """Up to ``n`` merges of ``fresh`` (in its order) whose result is not in ``have`` (module docstring)."""
    have, out = set(have), []
    for a, b in fresh:
        if a + b in have or a not in have or b not in have:
            continue
        out.append((a, b))
        have.add(a + b)
        if len(out) == n:
            break
    return out


def extend(base_file: Path, sample_files: list[Path], n: int, folder: Path) -> dict[str, Any]:
    """``base_file`` grown by up to ``n`` tokens learned on the sample, saved as
    ``folder/tokenizer.json`` with the base folder's companion files and ``extension.json``;
    returns what the manifest records of it (the base's sha256 and size, the tokens added)."""
    from tokenizers import Tokenizer

    spec = json.loads(base_file.read_text(encoding="utf-8"))
    model = spec["model"]
    base = Tokenizer.from_str(json.dumps(spec))
    size = base.get_vocab_size(with_added_tokens=True)
    # the fresh tokenizer needs room for the tokens both share: try growing sizes until n are new
    fresh_size, merges = 256 + len(SPECIAL_TOKENS) + 2 * n, []
    for _ in range(4):
        fresh = json.loads(train_bpe(sample_files, fresh_size, placeholders=False).to_str())["model"]
        merges = new_merges(_merges(fresh), set(model["vocab"]), n)
        if len(merges) == n or len(fresh["vocab"]) < fresh_size:  # enough, or the sample has no more
            break
        fresh_size *= 2
    added = []
    for k, (a, b) in enumerate(merges):
        token = a + b
        pieces = [t.id for t in base.model.tokenize(token)]
        model["vocab"][token] = size + k
        added.append({"id": size + k, "token": token, "base_pieces": pieces})
    pairs = isinstance(model["merges"][0], list) if model["merges"] else True
    model["merges"] += [[a, b] if pairs else f"{a} {b}" for a, b in merges]
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "tokenizer.json"
    out.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    info = {"base_sha256": sha256_file(base_file), "base_vocab_size": size, "added": len(added)}
    write_json_atomic(folder / EXTENSION_FILE, {**info, "rule": "mean of base pieces", "tokens": added})
    return info
