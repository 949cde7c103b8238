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
draw at rate budget/bytes), so the sample is deterministic and needs one pass, which runs per
chunk on the workers (:func:`sample_chunk`); the trainer reads the chunks' samples in chunk order.

Memory: SentencePiece holds the whole sample and its pair statistics while it trains, about
``SPM_BYTES_PER_SAMPLE_BYTE`` times the sample (measured), in the process that trains it (the
driver): ``tokenizer.sample_bytes`` bounds it, and is checked against ``memory_gib`` before any work.
"""

from __future__ import annotations

import re
import shutil
import time
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    from data_prep.config import PrepareConfig
    from data_prep.storage.workdir import Paths

from bloomline.errors import BloomlineError, DataError
from bloomline.host import available_cpus
from bloomline.io import copy_atomic, read_json, sha256_file, tmp_path, write_json_atomic
from data_prep.passes.alpha import alpha_weights
from data_prep.passes.chunks import chunk_table, dropped_positions
from data_prep.steps.document import uniform_draw
from data_prep.steps.pii import PLACEHOLDERS, redact

UNK, BOS, EOS, PAD = 0, 1, 2, 3
MAX_LINE = 16384


class TokenizerError(BloomlineError):
    pass


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


def train(
    sample_files: list[Path],
    model_prefix: Path,
    vocab_size: int,
    character_coverage: float,
    num_threads: int,
    seed: int,
) -> Path:
    """Train on ``sample_files`` (one sentence per line, read in order); returns the ``.model`` path.

    The text is streamed in through ``sentence_iterator`` and the model comes back through
    ``model_writer``: SentencePiece records ``input`` and ``model_prefix`` paths inside the
    model's TrainerSpec, which would make the model's bytes depend on the output folder.
    """
    import io

    import sentencepiece as spm

    if not sum(f.stat().st_size for f in sample_files):
        raise TokenizerError("no text left to train the tokenizer on (every document was dropped?)")

    def lines() -> Iterator[str]:
        for f in sample_files:
            with open(f, encoding="utf-8") as fh:
                yield from (line.rstrip("\n") for line in fh)

    spm.set_random_generator_seed(seed)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines(),
            model_writer=buf,
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            byte_fallback=True,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            pad_id=PAD,
            user_defined_symbols=list(PLACEHOLDERS.values()),
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            split_digits=True,
            allow_whitespace_only_pieces=True,
            max_sentence_length=MAX_LINE + 16,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise _training_error(e) from None
    model = model_prefix.with_suffix(".model")
    model.write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    model_prefix.with_suffix(".vocab").write_text(
        "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i)}\n" for i in range(sp.get_piece_size())), encoding="utf-8"
    )
    return model


def _training_error(e: RuntimeError) -> TokenizerError:
    """SentencePiece's refusal as one line naming the setting to change."""
    msg = str(e)
    m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
    if m:
        return TokenizerError(
            f"tokenizer.vocab_size={m.group(1)} is too large for this corpus: SentencePiece can build at most "
            f"{m.group(2)} pieces from the sample. Set -o tokenizer.vocab_size={m.group(2)} (or less), or add data."
        )
    m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", msg)
    if m:
        return TokenizerError(
            f"tokenizer.vocab_size={m.group(1)} is too small: it needs at least {m.group(2)} pieces (256 byte pieces, special "
            f"vocabulary at character_coverage. Raise tokenizer.vocab_size or lower tokenizer.character_coverage."
        )
    return TokenizerError(f"SentencePiece training failed: {msg.splitlines()[0] if msg else e}")


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


@lru_cache(maxsize=2)
def processor(path: str, sha: str) -> Any:
    """The SentencePiece model at ``path`` (cached per process; ``sha`` keys the cache to its content)."""
    import sentencepiece as spm

    # One thread: parallelism comes from one Dask worker process per core. SentencePiece's
    # default (-1 = every core, per call) oversubscribes the machine N-fold.
    return spm.SentencePieceProcessor(model_file=path, num_threads=1)


def sample_chunk(cid: int, cfg: PrepareConfig, out: str, rate: dict[str, float]) -> dict[str, Any]:
    """Chunk ``cid``'s part of the training sample: its kept documents drawn at their language's
    ``rate``, PII-redacted, as lines of ``.work/tok/sample-cNNNNNN.txt`` (its marker: the ``.json``)."""
    from data_prep.storage.workdir import Paths

    paths = Paths(Path(out))
    path = paths.work / "tok" / f"sample-c{cid:06d}.txt"
    marker = path.with_suffix(".json")
    if marker.exists():
        return read_json(marker)
    drops = dropped_positions(paths, cid)
    t = chunk_table(paths, cid, ["pos", "id", "lang", "text", "exact"])
    taken: dict[str, int] = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        for pos, did, lang, text, ex in zip(*(t.column(c).to_pylist() for c in ("pos", "id", "lang", "text", "exact"))):
            if pos in drops or uniform_draw(cfg.seed, "tok", did, ex) >= rate.get(lang, 0.0):
                continue
            if cfg.pii.enabled:
                text, _ = redact(text, cfg.pii.kinds)
            for line in sample_lines(text):
                f.write(line + "\n")
            taken[lang] = taken.get(lang, 0) + len(text.encode("utf-8"))
    tmp.replace(path)
    res = {"taken": taken}
    write_json_atomic(marker, res, durable=False)
    return res


def build_tokenizer(
    cfg: PrepareConfig, paths: Paths, dedup: dict[str, Any], chunk_ids: list[int], map_fn: Any = None
) -> dict[str, Any]:
    """The tokenizer pass: train SentencePiece on an alpha-smoothed, PII-redacted sample of the kept
    documents (or copy the configured model); marked done by ``.work/tokenizer.json``."""
    done = paths.work / "tokenizer.json"
    if done.exists() and paths.tokenizer.exists():
        return read_json(done)
    paths.tokenizer.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    if cfg.tokenizer.model:
        src = Path(cfg.tokenizer.model)
        if not src.is_file():
            raise DataError(f"tokenizer.model not found: {src}")
        check_model(src)
        copy_atomic(src, paths.tokenizer)
        info["trained"] = False
        info["source"] = str(src)
    else:
        weights = alpha_weights(dedup["kept_bytes"], cfg.tokenizer.alpha)
        budget = {lang: w * cfg.tokenizer.sample_bytes for lang, w in weights.items()}
        rate = {lang: min(1.0, budget[lang] / b) for lang, b in dedup["kept_bytes"].items() if b}
        taken: dict[str, int] = {}
        for r in (map_fn or (lambda f, xs: map(f, xs)))(
            partial(sample_chunk, cfg=cfg, out=str(paths.out), rate=rate), chunk_ids
        ):
            for lang, n in r["taken"].items():
                taken[lang] = taken.get(lang, 0) + n
        sample = [paths.work / "tok" / f"sample-c{cid:06d}.txt" for cid in chunk_ids]
        threads = cfg.tokenizer.num_threads or available_cpus()
        prefix = paths.work / "tok" / "tokenizer"
        prefix.parent.mkdir(parents=True, exist_ok=True)
        model = train(sample, prefix, cfg.tokenizer.vocab_size, cfg.tokenizer.character_coverage, threads, cfg.seed)
        copy_atomic(model, paths.tokenizer)
        vocab = prefix.with_suffix(".vocab")
        if vocab.exists():
            shutil.copyfile(vocab, paths.tokenizer.with_suffix(".vocab"))
        info["trained"] = True
        info["sample_bytes"] = dict(sorted(taken.items()))
        info["sample_weights"] = {k: round(v, 6) for k, v in weights.items()}
    info["vocab_size"] = check_model(paths.tokenizer)
    info["sha256"] = sha256_file(paths.tokenizer)
    info["seconds"] = time.perf_counter() - t0
    write_json_atomic(done, info)
    return info


def token_bytes(model_path: str | Path) -> "Any":
    """UTF-8 bytes of text each token id stands for (int64 array [vocab]), as bits per byte counts
    them (eval/RESULTS.md): a piece's text with SentencePiece's "▁" as one space, a byte-fallback
    piece ``<0xNN>`` as 1, a placeholder (``<EMAIL>``, a user-defined symbol) as its own text, and
    control and unknown tokens (``</s>``, ``<unk>``, ``<pad>``) as 0: they stand for no text."""
    import numpy as np
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    out = np.zeros(sp.get_piece_size(), dtype=np.int64)
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            continue
        out[i] = 1 if sp.is_byte(i) else len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    return out
