"""The numpy xxHash32 of many slices (data_prep/steps/xxh32.py) equals the xxhash library's."""

import numpy as np
import xxhash

from data_prep.steps.xxh32 import LONG, xxh32_slices


def test_every_length_and_offset_equals_xxhash():
    rng = np.random.default_rng(0)
    buf = rng.integers(0, 256, size=4000, dtype=np.uint8)
    # every length through a few stripes and past the one-call limit, at every alignment,
    # and slices ending exactly at the buffer's end
    lens = np.array([n for n in range(0, 80) for _ in range(4)] + [LONG - 1, LONG, LONG + 1, 1000, 3000])
    starts = np.array([(i * 7) % 900 for i in range(len(lens))])
    lens = np.concatenate([lens, [1, 4, 17, 0]])
    starts = np.concatenate([starts, [len(buf) - 1, len(buf) - 4, len(buf) - 17, len(buf)]])
    got = xxh32_slices(buf, starts, lens)
    want = [xxhash.xxh32_intdigest(buf[s : s + n].tobytes()) for s, n in zip(starts, lens)]
    assert got.tolist() == want


def test_no_slices():
    assert xxh32_slices(np.zeros(3, np.uint8), np.array([], np.int64), np.array([], np.int64)).tolist() == []
