"""xxHash32 (seed 0) of many byte slices of one buffer at once, in numpy.

Why not ``xxhash.xxh32_intdigest`` (the well-kept library, which the result equals bit for bit):
it hashes one slice per call, and a MinHash signature needs one hash per shingle — ~200 per
document, each made a Python string, encoded and passed in (~300 ns each, more than the hashing).
Here the slices of a batch of documents go through the algorithm together, one numpy operation
per step for all of them, so the cost per slice is a few ns of arithmetic.

The algorithm is XXH32 as its specification gives it (Cyan4973/xxHash, doc/xxhash_spec.md):
four accumulators over 16-byte stripes for inputs of 16 bytes or more, then the remaining 4-byte
words and bytes, then the avalanche; all arithmetic mod 2³² (numpy's uint32 wraps).
"""

from __future__ import annotations

import numpy as np
import xxhash

P1, P2, P3, P4, P5 = (np.uint32(p) for p in (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1))
LONG = 256
"""Slices longer than this are hashed one call each (a minified line's "words" can be kilobytes:
a numpy pass per 16 bytes of the longest slice would cost more than the calls)."""


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _words_at_every_offset(buf: np.ndarray) -> np.ndarray:
    """The little-endian uint32 starting at each byte of ``buf`` (zeros past its end): one
    gather reads a word at any offset."""
    b = np.zeros(len(buf) + 3, dtype=np.uint32)
    b[: len(buf)] = buf
    return b[:-3] | (b[1:-2] << np.uint32(8)) | (b[2:-1] << np.uint32(16)) | (b[3:] << np.uint32(24))


def xxh32_slices(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``xxhash.xxh32_intdigest(buf[s : s + n])`` for each (s, n), as uint32."""
    buf = np.ascontiguousarray(buf, dtype=np.uint8)
    starts, lens = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    out = np.empty(len(starts), dtype=np.uint32)
    long_ = np.flatnonzero(lens > LONG)
    for i in long_.tolist():
        out[i] = xxhash.xxh32_intdigest(buf[starts[i] : starts[i] + lens[i]].tobytes())
    short = np.flatnonzero(lens <= LONG)
    if not len(short):
        return out
    # longest first: the slices still in their stripes at step k are a prefix (slices, not gathers)
    short = short[np.argsort((LONG - lens[short]).astype(np.uint16), kind="stable")]  # a radix sort
    s, n = starts[short], lens[short]
    word = _words_at_every_offset(buf)
    last = len(word) - 1
    with np.errstate(over="ignore"):
        # inputs of 16 bytes or more: four accumulators over the 16-byte stripes
        stripes = n >> 4
        v = [
            np.full(len(s), P1 + P2, dtype=np.uint32),
            np.full(len(s), P2, dtype=np.uint32),
            np.zeros(len(s), dtype=np.uint32),
            np.full(len(s), np.uint32(0) - P1, dtype=np.uint32),
        ]
        for k in range(int(stripes[0])):
            c = int(np.count_nonzero(stripes > k))
            base = s[:c] + 16 * k
            for j in range(4):
                v[j][:c] = _rotl(v[j][:c] + word[base + 4 * j] * P2, 13) * P1
        h = np.where(stripes > 0, _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18), P5)
        h = h.astype(np.uint32) + n.astype(np.uint32)
        # the rest: up to three 4-byte words, then up to three bytes (past a slice's end, a read
        # is clipped to the buffer and its value not used)
        off, rest = s + (stripes << 4), n & 15
        for j in range(3):
            x = _rotl(h + word[np.minimum(off + 4 * j, last)] * P3, 17) * P4
            h = np.where(rest >= 4 * (j + 1), x, h)
        off, rest = off + (rest & ~3), rest & 3
        for j in range(3):
            x = _rotl(h + (word[np.minimum(off + j, last)] & np.uint32(0xFF)) * P5, 11) * P1
            h = np.where(rest > j, x, h)
        h ^= h >> np.uint32(15)
        h *= P2
        h ^= h >> np.uint32(13)
        h *= P3
        h ^= h >> np.uint32(16)
    out[short] = h
    return out
