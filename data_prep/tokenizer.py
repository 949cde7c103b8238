"""Tokenizer step: train a SentencePiece BPE model on an alpha-smoothed sample, or reuse one.

Special ids follow BLOOM's tokenizer: 0 <unk>, 1 <s>, 2 </s> (appended to every document as its
separator), 3 <pad>. The PII placeholders are user-defined symbols (one token each).

Training settings and why:
* BPE with ``byte_fallback`` — every string is encodable, nothing becomes <unk>.
* ``normalization_rule_name=identity`` and ``remove_extra_whitespaces=False`` — the normalize
  step already did NFC; SentencePiece's default NFKC and whitespace squeezing would rewrite text
  and destroy code indentation.
* ``split_digits`` — numbers tokenized digit by digit generalise better (LLaMA, PaLM).
* Lines longer than ``MAX_LINE`` bytes are cut (SentencePiece silently skips longer ones).

The sample: p(lang) ∝ bytes(lang)^alpha over the kept documents; each language contributes at
most ``p(lang)·sample_bytes`` bytes, chosen by a seeded hash of each document (a Bernoulli
draw at rate budget/bytes), so the sample is deterministic and needs one pass.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from bloomline.errors import BloomlineError
from data_prep.pii import PLACEHOLDERS

UNK, BOS, EOS, PAD = 0, 1, 2, 3
MAX_LINE = 16384


class TokenizerError(BloomlineError):
    pass


def alpha_weights(sizes: dict[str, float], alpha: float) -> dict[str, float]:
    """p_i ∝ (n_i / Σn)^alpha, normalized (alpha=1: proportional; →0: uniform)."""
    total = sum(sizes.values())
    if total <= 0:
        return {}
    raw = {k: (v / total) ** alpha for k, v in sizes.items() if v > 0}
    z = sum(raw.values())
    return {k: v / z for k, v in sorted(raw.items())}


def sample_lines(text: str) -> Iterable[str]:
    for line in text.split("\n"):
        if not line.strip():
            continue
        b = line.encode("utf-8")
        if len(b) <= MAX_LINE:
            yield line
        else:
            for i in range(0, len(b), MAX_LINE):
                yield b[i : i + MAX_LINE].decode("utf-8", "ignore")


def train(sample_file: Path, model_prefix: Path, vocab_size: int, character_coverage: float,
          num_threads: int, seed: int) -> Path:
    """Train on ``sample_file`` (one sentence per line); returns the ``.model`` path.

    The text is streamed in through ``sentence_iterator`` and the model comes back through
    ``model_writer``: SentencePiece records ``input`` and ``model_prefix`` paths inside the
    model's TrainerSpec, which would make the model's bytes depend on the output folder.
    """
    import io

    import sentencepiece as spm

    if not sample_file.is_file() or sample_file.stat().st_size == 0:
        raise TokenizerError("no text left to train the tokenizer on (every document was dropped?)")
    spm.set_random_generator_seed(seed)
    buf = io.BytesIO()
    try:
        with open(sample_file, encoding="utf-8") as lines:
            spm.SentencePieceTrainer.train(
                sentence_iterator=(line.rstrip("\n") for line in lines), model_writer=buf, model_type="bpe",
                vocab_size=vocab_size, character_coverage=character_coverage, byte_fallback=True,
                unk_id=UNK, bos_id=BOS, eos_id=EOS, pad_id=PAD,
                user_defined_symbols=list(PLACEHOLDERS.values()),
                normalization_rule_name="identity", remove_extra_whitespaces=False,
                split_digits=True, allow_whitespace_only_pieces=True, max_sentence_length=MAX_LINE + 16,
                input_sentence_size=0, shuffle_input_sentence=False, num_threads=num_threads,
                minloglevel=2,
            )
    except RuntimeError as e:
        msg = str(e)
        m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
        if m:
            raise TokenizerError(
                f"tokenizer.vocab_size={m.group(1)} is too large for this corpus: SentencePiece can build at most "
                f"{m.group(2)} pieces from the sample. Set -o tokenizer.vocab_size={m.group(2)} (or less), or add data."
            ) from None
        m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m:
            raise TokenizerError(
                f"tokenizer.vocab_size={m.group(1)} is too small: it needs at least {m.group(2)} pieces (256 byte pieces, special "
                f"vocabulary at character_coverage. Raise tokenizer.vocab_size or lower tokenizer.character_coverage."
            ) from None
        raise TokenizerError(f"SentencePiece training failed: {msg.splitlines()[0] if msg else e}") from None
    model = model_prefix.with_suffix(".model")
    model.write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    model_prefix.with_suffix(".vocab").write_text(
        "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n" for i in range(sp.get_piece_size())), encoding="utf-8")
    return model


def check_model(path: Path) -> int:
    """Load a SentencePiece model, check BLOOM's special ids; return its vocab size."""
    import sentencepiece as spm

    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise TokenizerError(f"cannot load tokenizer {path}: {e}") from None
    if sp.eos_id() < 0:
        raise TokenizerError(f"tokenizer {path} has no </s> (eos) piece; bloomline separates documents with it")
    return sp.get_piece_size()
