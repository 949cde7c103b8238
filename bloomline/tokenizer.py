"""The one reader of a tokenizer file, of either kind bloomline prepares data with.

* ``sentencepiece``: a SentencePiece ``.model`` (what ``bloomline prepare`` trains by default).
* ``byte_bpe``: a Hugging Face ``tokenizer.json`` of byte-level BPE, BLOOM's own kind (250,680
  tokens for BLOOM), read with the ``tokenizers`` library, the library that wrote it.

Both give the same things: the ids of the special tokens, batch encoding (each document's ids
ending in ``</s>``), decoding, and the UTF-8 bytes each id stands for (:meth:`Tokenizer.token_bytes`,
what bits per byte divides by, eval/RESULTS.md). A byte-level token's string is one character per
byte (GPT-2's byte-to-unicode map), so its byte count is its length; an added token that is not
special (a PII placeholder) stands for its own text; a special token for none.

Opening checks that the tokenizer gives back what it was given: on a probe text of several
scripts, code and leading spaces, decoding the encoding is the text and the token bytes sum to
its UTF-8 length. A tokenizer that normalises text (lowercasing, NFKC) or adds some (a prefix
space) would make bits per byte count bytes that are not in the data, so it is refused in one line.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

import numpy as np

from bloomline.errors import BloomlineError

Kind = Literal["sentencepiece", "byte_bpe"]
KINDS: tuple[str, ...] = ("sentencepiece", "byte_bpe")
HF_FILE = "tokenizer.json"
"""A Hugging Face tokenizer's file, in the folders transformers saves."""
HF_COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json")
"""Files beside ``tokenizer.json`` that ``AutoTokenizer`` reads (special tokens, the class): kept
with it, so an export's tokenizer loads as the source folder's does."""
SPECIALS = {"unk": ("<unk>",), "bos": ("<s>",), "eos": ("</s>", "<|endoftext|>"), "pad": ("<pad>",)}
"""Where a ``tokenizer.json`` does not name them (its folder's tokenizer_config.json), the special
tokens are found by these names: BLOOM's, then GPT-2's end of text."""
PROBE = "Ein Satz, 中文文本 और हिन्दी.\n    def f(x):\n\treturn x  # 42\n  Ελληνικά ،عربي "
"""Text the round-trip check encodes: scripts, code indentation, tabs, leading and trailing spaces."""


class TokenizerError(BloomlineError):
    pass


def tokenizer_file(path: str | Path) -> Path:
    """The tokenizer file ``path`` names: a ``.model``, a ``tokenizer.json``, or a folder holding
    one (a Hugging Face model folder). One-line error otherwise."""
    p = Path(path)
    if p.is_dir():
        if (p / HF_FILE).is_file():
            return p / HF_FILE
        models = sorted(p.glob("*.model"))
        if len(models) == 1:
            return models[0]
        raise TokenizerError(f"{p} holds no {HF_FILE} and no single SentencePiece .model")
    if not p.is_file():
        raise TokenizerError(f"tokenizer not found: {p}")
    return p


def tokenizer_files(path: str | Path) -> list[Path]:
    """The files of the tokenizer ``path`` names: its file, then the companions beside a tokenizer.json."""
    f = tokenizer_file(path)
    extra = [f.parent / c for c in HF_COMPANIONS] if kind_of(f) == "byte_bpe" else []
    return [f, *(c for c in extra if c.is_file())]


def kind_of(path: str | Path) -> Kind:
    """The kind of a tokenizer file, by its name: ``*.json`` is a Hugging Face tokenizer."""
    return "byte_bpe" if Path(path).suffix == ".json" else "sentencepiece"


class Tokenizer:
    """A tokenizer file opened for encoding and decoding (:func:`open_tokenizer`)."""

    kind: Kind
    path: Path
    vocab_size: int
    """Ids are 0 .. vocab_size-1 (added tokens included)."""
    ids: dict[str, int]
    """The special tokens' ids by role (unk, bos, eos, pad); -1 where the tokenizer has none."""

    @property
    def eos_id(self) -> int:
        return self.ids["eos"]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids followed by ``</s>``, as int32 arrays."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` alone (no ``</s>``)."""
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of text each id stands for (int64 [vocab_size]); 0 for special tokens."""
        raise NotImplementedError

    def check(self) -> "Tokenizer":
        """Refuse a tokenizer without ``</s>`` or one that does not give back its text (module docstring)."""
        if self.eos_id < 0:
            raise TokenizerError(
                f"tokenizer {self.path} has no </s> (eos) token; bloomline separates documents with it"
            )
        ids = self.encode(PROBE)
        nbytes, want = int(self.token_bytes()[ids].sum()) - self.added_bytes, len(PROBE.encode("utf-8"))
        if self.decode(ids) != PROBE or nbytes != want:
            raise TokenizerError(
                f"tokenizer {self.path} does not give back the text it encodes ({nbytes} bytes for {want}: it "
                f"normalises or adds text), so bits per byte would not count the data's bytes"
            )
        return self

    added_bytes = 0
    """Bytes an encoding adds in front of every text (SentencePiece's dummy-prefix "▁"), counted by bits
    per byte as the model predicts them (eval/RESULTS.md)."""


class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    @property
    def added_bytes(self) -> int:  # type: ignore[override]
        """1 where the model adds its dummy prefix (SentencePiece's default, kept by bloomline's)."""
        return int(self.sp.encode("x", out_type=str)[0].startswith("\u2581"))

    def __init__(self, path: Path):
        import sentencepiece as spm

        self.path = path
        try:
            # One thread: parallelism comes from one Dask worker process per core. SentencePiece's
            # default (-1 = every core, per call) oversubscribes the machine N-fold.
            self.sp = spm.SentencePieceProcessor(model_file=str(path), num_threads=1)
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"cannot load tokenizer {path}: {e}") from None
        sp = self.sp
        self.vocab_size = sp.get_piece_size()
        self.ids = {"unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id()}

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # SentencePiece's numpy output fills each array in C++: a list of Python ints, then
        # converted, cost a fifth more than the encoding itself (measured on the 4x bench corpus).
        return list(self.sp.encode(texts, add_eos=True, return_type="numpy"))

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def token_bytes(self) -> np.ndarray:
        """A piece's text with SentencePiece's "▁" as one space, a byte-fallback piece ``<0xNN>``
        as 1, a placeholder (a user-defined symbol) as its own text, control and unknown as 0."""
        sp = self.sp
        out = np.zeros(sp.get_piece_size(), dtype=np.int64)
        for i in range(sp.get_piece_size()):
            if sp.is_control(i) or sp.is_unknown(i):
                continue
            out[i] = 1 if sp.is_byte(i) else len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
        return out


class ByteBPETokenizer(Tokenizer):
    kind = "byte_bpe"

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        # Encoding runs in one Dask worker process per core: the library's own thread pool would
        # oversubscribe the cores as SentencePiece's would (its documented switch).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.path = path
        try:
            text = path.read_text(encoding="utf-8")
            spec, self.tok = json.loads(text), HFTokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 - the library raises bare Exception
            raise TokenizerError(f"cannot load tokenizer {path}: {str(e).splitlines()[0] if str(e) else e}") from None
        if not _byte_level(spec):
            raise TokenizerError(
                f"tokenizer {path} is not byte-level BPE (its decoder is "
                f"{(spec.get('decoder') or {}).get('type')}): bloomline reads byte-level tokenizer.json files, BLOOM's kind"
            )
        if (spec.get("post_processor") or {}).get("type") == "ByteLevel":
            # It only trims offsets, which no caller keeps, and took a fifth of the encoding time
            # (measured on 46 languages); the ids are the same without it.
            self.tok.post_processor = None
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        named = _named_specials(path.parent)
        vocab = self.tok.get_vocab(with_added_tokens=True)
        self.ids = {
            role: next((vocab[n] for n in ((named[role],) if role in named else names) if n in vocab), -1)
            for role, names in SPECIALS.items()
        }

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        eos = self.eos_id
        out = []
        for enc in self.tok.encode_batch_fast(texts, add_special_tokens=False):
            a = np.empty(len(enc.ids) + 1, dtype=np.int32)
            a[:-1] = enc.ids
            a[-1] = eos
            out.append(a)
        return out

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def token(self, i: int) -> str:
        """The token of id ``i`` as the vocabulary writes it."""
        return self.tok.id_to_token(i)

    def token_bytes(self) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.int64)
        added = self.tok.get_added_tokens_decoder()
        for token, i in self.tok.get_vocab(with_added_tokens=False).items():
            if i not in added:
                out[i] = len(token)  # byte-level: one character per byte
        for i, t in added.items():
            out[i] = 0 if t.special else len(t.content.encode("utf-8"))
        return out


def _byte_level(spec: dict[str, Any]) -> bool:
    """Whether a tokenizer.json decodes bytes as byte-level BPE does (its decoder, or one of a sequence's)."""
    dec = spec.get("decoder") or {}
    parts = dec.get("decoders", [dec]) if dec.get("type") == "Sequence" else [dec]
    return (spec.get("model") or {}).get("type") == "BPE" and any(p.get("type") == "ByteLevel" for p in parts)


def _named_specials(folder: Path) -> dict[str, str]:
    """The special tokens a folder's tokenizer_config.json names (``eos_token`` etc.), by role."""
    f = folder / "tokenizer_config.json"
    if not f.is_file():
        return {}
    try:
        conf = json.loads(f.read_text(encoding="utf-8"))
    except ValueError as e:
        raise TokenizerError(f"{f} is not JSON: {e}") from None
    out = {}
    for role in SPECIALS:
        v = conf.get(f"{role}_token")
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[role] = v
    return out


def open_tokenizer(path: str | Path, sha: Optional[str] = None) -> Tokenizer:
    """The tokenizer in ``path`` (a file or a folder, :func:`tokenizer_file`), checked. Cached per
    process by path and ``sha`` (the file's sha256, when the caller knows it: a changed file is
    opened again)."""
    return _open(str(tokenizer_file(path)), sha)


@lru_cache(maxsize=4)
def _open(path: str, sha: Optional[str]) -> Tokenizer:
    p = Path(path)
    tok = ByteBPETokenizer(p) if kind_of(p) == "byte_bpe" else SentencePieceTokenizer(p)
    return tok.check()


def token_bytes(path: str | Path) -> np.ndarray:
    """:meth:`Tokenizer.token_bytes` of the tokenizer in ``path``."""
    return open_tokenizer(path).token_bytes()
