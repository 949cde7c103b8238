"""The decoded size of each batch of an Arrow stream, read from its metadata and the prefixes of its
compressed buffers (data_prep/inputs/ipc_sizes.py), is what pyarrow decodes it to; a stream cut short or
with damaged bytes is scanned up to where it breaks, never raising (issue 37, item 5)."""

import random
from pathlib import Path

import pyarrow as pa
import pytest

from data_prep.inputs.ipc_sizes import decoded_bytes, scan
from tests.support.fuzz_inputs import STREAM_COMPRESSIONS, write_saved_dataset

TABLE = pa.table(
    {
        "text": ["a short one", None, "x" * 5000, "", "word " * 300, "é" * 100],
        "n": [1, 2, None, 4, 5, 6],
        "tags": [["a", "b"], [], None, ["c" * 700], ["d"], ["e", None]],
        "meta": [{"k": "v" * i} for i in range(6)],
        "lang": pa.array(["en", "fr", "en", "en", "de", "fr"]).dictionary_encode(),
    }
)


def stream(folder: Path, compression: str | None) -> Path:
    write_saved_dataset(folder, TABLE, compression, batch_rows=2)
    return folder / "data-00000-of-00001.arrow"


def held(arrays: list[pa.Array]) -> int:
    """The bytes of the buffers pyarrow decoded ``arrays`` into (their children's too)."""
    return sum(b.size for a in arrays for b in a.buffers() if b is not None)


@pytest.mark.parametrize("compression", STREAM_COMPRESSIONS)
def test_each_batch_and_dictionary_is_sized_as_pyarrow_decodes_it(tmp_path, compression):
    f = stream(tmp_path, compression)
    batches = list(pa.ipc.open_stream(pa.memory_map(str(f))))
    s = scan(str(f))
    assert s.error is None
    got = [(m.kind, m.rows, m.decoded, m.compressed) for m in s.messages]
    # the first batch comes after its dictionary, the others use it as it is (no delta)
    want = [("dictionary", 3, held([batches[0].column("lang").dictionary]), compression is not None)]
    for b in batches:
        plain = [c.indices if pa.types.is_dictionary(c.type) else c for c in b.columns]
        want.append(("batch", b.num_rows, held(plain), compression is not None))
    assert got == want
    assert decoded_bytes(str(f), 1 << 30) == sum(m.decoded for m in s.messages)
    # a compressed message over the bound is left out of what a reader decodes
    assert decoded_bytes(str(f), 0) == (0 if compression else decoded_bytes(str(f), 1 << 30))


def test_a_stream_cut_short_or_damaged_is_scanned_up_to_where_it_breaks(tmp_path):
    f = stream(tmp_path, "zstd")
    whole = f.read_bytes()
    ends = [m.end for m in scan(str(f)).messages]
    f.write_bytes(whole[: ends[-1] - 10])  # into the last batch
    s = scan(str(f))
    assert [m.end for m in s.messages] == ends[:-1] and s.error is not None
    rng = random.Random(0)
    for _ in range(300):  # every byte is the file's word: damage anywhere is an error, not a crash
        data = bytearray(whole)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        f.write_bytes(bytes(data))
        s = scan(str(f))
        assert all(m.decoded >= 0 and m.rows >= 0 for m in s.messages)
