"""Hostile inputs for ``prepare``, generated with Hypothesis.

The strategies (tests/data_prep/inputs/test_fuzz.py runs them in CI, a few examples with a fixed seed):

* :func:`lines`: JSONL lines as other people's tools write them — records with hostile text
  (controls, bidi marks, zero-width and combining characters, lone surrogates, NUL, terminal
  escapes, rich markup, secrets), wrong types for every field, values that are not objects, JSON
  cut anywhere, nesting past Python's recursion limit, invalid UTF-8, binary junk, lines over the
  size limit, blank lines, ids longer than the drop log keeps;
* :func:`tables`: Parquet tables (and Arrow streams, :func:`write_saved_dataset`) with wrong
  column types, nulls, nested and binary columns, dictionary-encoded strings, empty row groups and
  dictionary bombs: one value over the size limit that every row points at, alone or many times
  in a list (:func:`dictionary_bomb` makes the full-size one: a few KB of file, gigabytes decoded);
* :func:`cut_gzip`: a gzip stream of lines cut at any byte;
* :func:`overrides`: ``-o key=value`` with real and made-up keys and hostile YAML values;
* :func:`hostile_runs`: a megabyte of each shape that made a search quadratic or hold a match per
  character (one record's id of ``a.a.a…`` stalled the filter report's masking for hours).

``bench/fuzz.py`` runs them at length (its long run).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

MAX_DOC_BYTES = 4096
"""``read.max_doc_bytes`` of the fuzzed runs: small, so over-long lines are cheap to make."""

SPECIAL = [
    "\x00",
    "\x07",
    "\x1b[31m",
    "\r",
    "\x0b",
    "\x85",
    "\u2028",
    "\u2029",
    "\u200b",
    "\u200d",
    "\ufeff",
    "\u202e",
    "\u202d",
    "\u2066",
    "\u0301" * 20,
    "\ud800",
    "\udfff",
    "\U0001f600",
    "\ufffd",
    "\uffff",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "ﷺ",
    "\u0e4f" * 10,
    "<script>alert(1)</script>",
    "' OR 1=1 --",
    "%s%n",
    "../../etc/passwd",
    # terminal escapes and rich markup (shown inert: bloomline/terminal.py)
    "[bold red]x[/]",
    "[link=file:///etc/passwd]y[/link]",
    "\x1b]0;pwned\x07",
    "\x9b31m",
    "\x9d8;;http://evil\x9c",
    # secrets (masked: bloomline/secrets.py), one with "@" and "/" in its password
    "s3://user:p@ss/w0rd@host/x",
    "https://h/x?client_secret=abc&apikey=def&X-Goog-Signature=0ff",
]
SCALABLE = {
    "dotted": "a.",  # the URL pattern's scheme, quadratic before issue 37
    "url-heads": "a://b:",  # a password search started at every head
    "scheme-runs": "a.a.a.a://",
    "at-signs": "x://u:a@",
    "query": "&a",
    "colons": ":",  # a PII seed match every other character
}
"""Shapes that made a search backtrack or hold a match per character, repeated to any length."""


def hostile_runs(size: int = 1 << 20) -> dict[str, str]:
    """Each :data:`SCALABLE` shape repeated to ``size`` characters: what one record's id or text may
    be, for the searches that run over whatever a file holds (masking, PII, the filter report)."""
    return {k: (v * (size // len(v) + 1))[:size] for k, v in SCALABLE.items()}


LANG_LABELS = [
    "en",
    "fr",
    "sw",
    "yo",
    "zh-Hans",
    "zh",
    "ar",
    "hi",
    "code-python",
    "python",
    "EN",
    "En ",
    "xx",
    "",
    "und",
    "__label__en",
    "en\u0000",
    "\u202een",
]

hostile_text = st.lists(
    st.one_of(
        st.text(max_size=30),
        st.sampled_from(SPECIAL),
        st.sampled_from(["the market opens", "le marché", "soko", "市场", "السوق"]),
    ),
    max_size=12,
).map("".join)
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), hostile_text
)
json_value = st.recursive(
    json_leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(hostile_text, kids, max_size=4), max_leaves=10
)
record = st.fixed_dictionaries(
    {
        "text": st.one_of(hostile_text, hostile_text, json_value),
        "lang": st.one_of(st.sampled_from(LANG_LABELS), json_value),
    },
    optional={"id": json_value, "meta": json_value},
)


def _dump(rec: Any, ascii_: bool) -> bytes:
    return json.dumps(rec, ensure_ascii=ascii_).encode("utf-8", "surrogatepass")


@st.composite
def lines(draw: Any) -> bytes:
    """One JSONL line (no newline in it): a record, or a way a record goes wrong."""
    kind = draw(
        st.sampled_from(
            [
                "record",
                "record",
                "record",
                "value",
                "deep",
                "cut",
                "utf8",
                "junk",
                "long",
                "blank",
                "nan",
                "bigint",
                "dupkeys",
                "long_id",
            ]
        )
    )
    if kind == "record":
        return _dump(draw(record), draw(st.booleans())).replace(b"\n", b"\\n")
    if kind == "value":  # valid JSON, not an object
        return _dump(draw(json_value), True)
    if kind == "deep":  # valid JSON nested past Python's recursion limit (or near it)
        n = draw(st.integers(500, 20000))
        return draw(st.sampled_from([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n]))
    if kind == "cut":  # a record cut anywhere
        whole = _dump(draw(record), True)
        return whole[: draw(st.integers(0, max(0, len(whole) - 1)))]
    if kind == "utf8":  # a stray byte that is not UTF-8
        whole = _dump(draw(record), False)
        at = draw(st.integers(0, len(whole)))
        return whole[:at] + bytes([draw(st.integers(0x80, 0xFF))]) + whole[at:]
    if kind == "junk":
        return draw(st.binary(max_size=120)).replace(b"\n", b"")
    if kind == "long":  # over read.max_doc_bytes
        return _dump({"text": "w " * draw(st.integers(MAX_DOC_BYTES // 2, MAX_DOC_BYTES * 2)), "lang": "en"}, True)
    if kind == "blank":
        return draw(st.sampled_from([b"", b"   ", b"\t", b"\r", b" \x0c "]))
    if kind == "nan":
        return b'{"text": NaN, "lang": Infinity, "id": -Infinity}'
    if kind == "bigint":  # past Python's int-to-str digit limit
        return b'{"text": "x", "lang": "en", "id": ' + b"9" * draw(st.integers(4000, 6000)) + b"}"
    if (
        kind == "long_id"
    ):  # an id longer than the drop log keeps (data_prep/storage/droplog.py ID_CHARS), under the size limit
        shape = draw(st.sampled_from(sorted(SCALABLE.values())))
        doc_id = shape * draw(st.integers(300 // len(shape), (MAX_DOC_BYTES // 2) // len(shape)))
        return _dump({"id": doc_id, "text": draw(hostile_text), "lang": draw(st.sampled_from(LANG_LABELS))}, True)
    return b'{"text": "first", "text": "second", "lang": "en", "lang": "fr"}'  # duplicate keys


def jsonl_bytes(ls: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in ls)


def records_in(data: bytes) -> int:
    """Non-blank lines (what the reader books), as the reader splits them."""
    return sum(1 for line in data.split(b"\n") if line.strip())


@st.composite
def tables(draw: Any) -> Any:
    """A hostile Parquet table: each of text/lang/id of some type, nulls anywhere, sometimes missing."""
    import pyarrow as pa

    n = draw(st.integers(0, 30))
    strs = st.lists(
        st.one_of(st.none(), hostile_text.map(lambda s: s.encode("utf-8", "replace").decode("utf-8"))),
        min_size=n,
        max_size=n,
    )
    kinds = {
        "string": lambda: pa.array(draw(strs), pa.string()),
        "large_string": lambda: pa.array(draw(strs), pa.large_string()),
        "dictionary": lambda: pa.array(draw(strs), pa.string()).dictionary_encode(),
        "int": lambda: pa.array(
            draw(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=n, max_size=n)), pa.int64()
        ),
        "double": lambda: pa.array(draw(st.lists(st.floats(allow_nan=True), min_size=n, max_size=n)), pa.float64()),
        "binary": lambda: pa.array([None if s is None else s.encode() for s in draw(strs)], pa.binary()),
        "list": lambda: pa.array([None if s is None else [s, s] for s in draw(strs)], pa.list_(pa.string())),
        "struct": lambda: pa.array(
            [None if s is None else {"a": s} for s in draw(strs)], pa.struct([("a", pa.string())])
        ),
        "null": lambda: pa.nulls(n),
        # one value over read.max_doc_bytes that every row points at, and 8 times in each row's list
        "bomb": lambda: pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array([big])),
        "list_bomb": lambda: pa.ListArray.from_arrays(
            pa.array(range(0, 8 * n + 1, 8), pa.int32()),
            pa.DictionaryArray.from_arrays(pa.array([0] * 8 * n, pa.int32()), pa.array([big])),
        ),
    }
    big = "w " * draw(st.integers(MAX_DOC_BYTES // 2 + 1, MAX_DOC_BYTES))
    cols = {}
    for name in ("text", "lang", "id"):
        kind = draw(st.sampled_from([*kinds, "missing"]))
        if kind != "missing":
            cols[name] = kinds[kind]()
    if "lang" in cols and draw(st.booleans()):  # mostly real labels, so rows get past the language check
        cols["lang"] = pa.array(draw(st.lists(st.sampled_from(LANG_LABELS), min_size=n, max_size=n)), pa.string())
    return pa.table(cols) if cols else pa.table({"other": pa.array(range(n))}), draw(st.integers(1, 8))


def dictionary_bomb(value_bytes: int, refs: int, ordinary: list[dict]) -> Any:
    """A table whose text column is dictionary-encoded: one value of ``value_bytes`` that the first
    ``refs`` rows point at, then the ``ordinary`` records. Parquet stores the value once (8 MiB and
    1,024 rows: a file of a few KB, 8 GiB as Python strings), so does an Arrow stream."""
    import pyarrow as pa

    texts = ["bomb " * (value_bytes // 5) + "b" * (value_bytes % 5), *(r["text"] for r in ordinary)]
    idx = [0] * refs + list(range(1, len(texts)))
    return pa.table(
        {
            "id": [f"bomb-{i}" for i in range(refs)] + [r["id"] for r in ordinary],
            "text": pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(texts)),
            "lang": ["en"] * refs + [r["lang"] for r in ordinary],
        }
    )


STREAM_COMPRESSIONS = (None, "lz4", "zstd")
"""What the buffers of a saved dataset's Arrow stream may be compressed with (``datasets`` writes
none; a compressed batch is decoded whole, data_prep/inputs/ipc_sizes.py)."""


def write_saved_dataset(folder: Path, table: Any, compression: str | None = None, batch_rows: int = 0) -> None:
    """``table`` as ``datasets.Dataset.save_to_disk`` lays one out: an Arrow stream and the
    ``state.json`` naming it (``datasets`` itself would decode a dictionary column), in batches
    of ``batch_rows`` (default: a third of the rows), their buffers compressed with
    ``compression`` (``"zstd"``, ``"lz4"``; ``datasets`` writes none, other writers may)."""
    import pyarrow as pa

    folder.mkdir(parents=True, exist_ok=True)
    opts = pa.ipc.IpcWriteOptions(compression=compression)
    with (
        pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as f,
        pa.ipc.new_stream(f, table.schema, options=opts) as w,
    ):
        w.write_table(table, max_chunksize=batch_rows or max(1, table.num_rows // 3))
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (folder / "dataset_info.json").write_text("{}")


@st.composite
def cut_gzip(draw: Any) -> tuple[bytes, bytes]:
    """(the lines, a gzip stream of them cut at some byte before its end)."""
    data = jsonl_bytes(draw(st.lists(lines(), min_size=1, max_size=40)))
    whole = gzip.compress(data)
    return data, whole[: draw(st.integers(1, len(whole) - 1))]


def gzip_prefix_records(data: bytes, cut: bytes) -> tuple[int, bool]:
    """(non-blank lines wholly decompressible from ``cut``, whether ``cut`` is a whole stream)."""
    d = zlib.decompressobj(31)
    try:
        out = d.decompress(cut)
    except zlib.error:
        out = b""
    if d.eof:
        return records_in(data), True
    return records_in(out[: out.rfind(b"\n") + 1]), False


FIELDS = [
    "read.chunk_bytes",
    "read.max_doc_bytes",
    "dedup.threshold",
    "dedup.num_perm",
    "pack.buckets",
    "pack.seq_len",
    "tokenizer.vocab_size",
    "langid.min_confidence",
    "filters.defaults.min_words",
    "memory_gib",
    "seed",
    "dask.n_workers",
    "sources",
    "filters.languages.en.max_char_rep",
    "nonsense",
    "read",
    "a.b.c.d",
]


@st.composite
def overrides(draw: Any) -> str:
    """One ``-o`` value as a user might type it, or a hostile one."""
    key = draw(st.one_of(st.sampled_from(FIELDS), st.text(max_size=20)))
    value = draw(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(
                [
                    "[1, 2",
                    "{a: [}",
                    "!!python/object:os.system",
                    "null",
                    "1e309",
                    "-1",
                    "0",
                    "[]",
                    "{}",
                    "&a [*a]",
                    "~",
                    "'\u202e'",
                    "\x00",
                    "9" * 5000,
                ]
            ),
        )
    )
    return draw(st.sampled_from([f"{key}={value}", f"{key}", f"={value}", f"{key}=={value}"]))
