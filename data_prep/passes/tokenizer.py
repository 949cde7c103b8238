"""The tokenizer pass: train a tokenizer on an alpha-smoothed sample, grow a given one, or reuse one
(bloomline/tokenizer.py reads either kind: a SentencePiece ``.model`` or a Hugging Face
``tokenizer.json``). This module trains SentencePiece, the default; data_prep/passes/byte_bpe.py
trains and grows BLOOM's own kind, byte-level BPE.

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

Memory: the trainer holds the whole sample and its pair statistics while it trains, about
``SPM_BYTES_PER_SAMPLE_BYTE`` times the sample for SentencePiece and ``BPE_BYTES_PER_SAMPLE_BYTE``
for the tokenizers BPE trainer (data_prep/passes/budget.py, measured), in the process that trains
it (the driver): ``tokenizer.sample_bytes`` bounds it, checked against ``memory_gib`` before any work.
"""

from __future__ import annotations

import re
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

if TYPE_CHECKING:
    from data_prep.config import PrepareConfig
    from data_prep.storage.workdir import Paths

from bloomline.host import available_cpus
from bloomline.io import copy_atomic, publish, read_json, sha256_file, tmp_path, write_json_atomic
from bloomline.tokenizer import HF_COMPANIONS, HF_FILE, TokenizerError, kind_of, open_tokenizer, tokenizer_file
from data_prep.passes import byte_bpe
from data_prep.passes.alpha import alpha_weights
from data_prep.passes.chunks import chunk_table, dropped_positions
from data_prep.steps.document import uniform_draw
from data_prep.steps.pii import PLACEHOLDERS, redact

UNK, BOS, EOS, PAD = 0, 1, 2, 3
MAX_LINE = 16384


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


def sample_chunk(cid: int, cfg: PrepareConfig, out: str, rate: dict[str, float]) -> dict[str, Any]:
    """Chunk ``cid``'s part of the training sample: its kept documents drawn at their language's
    ``rate``, PII-redacted, as lines of ``.work/tok/sample-cNNNNNN.txt`` (its marker: the ``.json``)."""
    from data_prep.storage.workdir import Paths

    paths = Paths.at(out)
    path, marker = paths.work / "tok" / f"sample-c{cid:06d}.txt", paths.tok_sample(cid, ".json")
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
    publish(tmp, path)
    res = {"taken": taken}
    write_json_atomic(marker, res, durable=False)
    return res


def build_tokenizer(
    cfg: PrepareConfig, paths: Paths, dedup: dict[str, Any], chunk_ids: list[int], map_fn: Any = None
) -> dict[str, Any]:
    """The tokenizer pass: copy the configured tokenizer (``tokenizer.model``), or train one of
    ``tokenizer.kind`` on an alpha-smoothed, PII-redacted sample of the kept documents, or grow the
    configured one by ``tokenizer.extend_with`` tokens learned on that sample; into
    ``DIR/tokenizer/``, marked done by ``.work/tokenizer.json``."""
    done = paths.work_file("tokenizer.json")
    if done.exists() and paths.tokenizer.exists():
        return read_json(done)
    t, folder = cfg.tokenizer, paths.out / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info: dict[str, Any] = {"trained": False}
    if t.model and not t.extend_with:
        src = tokenizer_file(t.model)
        open_tokenizer(src)  # refused here, in one line, before it is copied
        copy_tokenizer(src, folder)
        info["source"] = str(src)
    else:
        weights = alpha_weights(dedup["kept_bytes"], t.alpha)
        info.update(trained=True, sample_weights={k: round(v, 6) for k, v in weights.items()})
        info["sample_bytes"] = draw_sample(cfg, paths, weights, dedup["kept_bytes"], chunk_ids, map_fn)
        sample = [paths.tok_sample(cid) for cid in chunk_ids]
        if t.extend_with:
            base = tokenizer_file(t.model)  # type: ignore[arg-type]
            if kind_of(base) != "byte_bpe":
                raise TokenizerError(
                    f"tokenizer.extend_with grows a tokenizer.json (byte-level BPE); {base} is not one"
                )
            grown = byte_bpe.extend(base, sample, t.extend_with, paths.work / "tok" / "grown")
            info["extends"] = {**grown, "file": f"tokenizer/{byte_bpe.EXTENSION_FILE}"}
            copy_tokenizer(paths.work / "tok" / "grown" / HF_FILE, folder, companions_of=base)
            copy_atomic(paths.work / "tok" / "grown" / byte_bpe.EXTENSION_FILE, folder / byte_bpe.EXTENSION_FILE)
        elif t.kind == "byte_bpe":
            copy_tokenizer(byte_bpe.train_byte_bpe(sample, paths.work / "tok" / "bpe", t.vocab_size), folder)
        else:
            threads = t.num_threads or available_cpus()
            prefix = paths.work / "tok" / "tokenizer"
            model = train(sample, prefix, t.vocab_size, t.character_coverage, threads, cfg.seed)
            copy_tokenizer(model, folder)
            copy_atomic(prefix.with_suffix(".vocab"), folder / "tokenizer.vocab")
    tok = open_tokenizer(paths.tokenizer)
    info.update(kind=tok.kind, vocab_size=tok.vocab_size, sha256=sha256_file(paths.tokenizer))
    info["seconds"] = time.perf_counter() - t0
    write_json_atomic(done, info)
    return info


def draw_sample(
    cfg: PrepareConfig,
    paths: Paths,
    weights: dict[str, float],
    kept_bytes: dict[str, int],
    chunk_ids: list[int],
    map_fn: Any = None,
) -> dict[str, int]:
    """Write each chunk's part of the training sample (:func:`sample_chunk`, on the workers); the
    bytes taken per language."""
    budget = {lang: w * cfg.tokenizer.sample_bytes for lang, w in weights.items()}
    rate = {lang: min(1.0, budget[lang] / b) for lang, b in kept_bytes.items() if b}
    taken: dict[str, int] = {}
    for r in (map_fn or (lambda f, xs: map(f, xs)))(
        partial(sample_chunk, cfg=cfg, out=paths.where, rate=rate), chunk_ids
    ):
        for lang, n in r["taken"].items():
            taken[lang] = taken.get(lang, 0) + n
    return dict(sorted(taken.items()))


def copy_tokenizer(src: Path, folder: Path, companions_of: Optional[Path] = None) -> None:
    """``src`` into the run's ``tokenizer/`` folder under its kind's name (``tokenizer.model`` or
    ``tokenizer.json``), a tokenizer.json with the companion files of its folder (or of
    ``companions_of``'s), which ``AutoTokenizer`` reads: the export ships them unchanged."""
    if kind_of(src) == "sentencepiece":
        copy_atomic(src, folder / "tokenizer.model")
        return
    for f in HF_COMPANIONS:
        if (Path(companions_of or src).parent / f).is_file():
            copy_atomic(Path(companions_of or src).parent / f, folder / f)
    if not (folder / "tokenizer_config.json").is_file():  # what AutoTokenizer needs to name the specials
        tok = open_tokenizer(src)
        specials = {f"{role}_token": tok.token(i) for role, i in tok.ids.items() if i >= 0}
        write_json_atomic(folder / "tokenizer_config.json", byte_bpe.hf_config(specials))
    copy_atomic(src, folder / HF_FILE)
