"""How much text a ``.jsonl.gz`` input holds, honestly, before it is read.

A gzip member ends with ISIZE, its uncompressed size **modulo 4 GiB** (RFC 1952, 2.3.1), so the
trailer alone under-states any text over 4 GiB, and a truncated file has no trailer at all: its
last four bytes are whatever data was there (a 3 KB file cut in half read as 1,948 MiB). The
estimate here starts from what the file really decompresses to:

* a file small enough to decompress within the sample is measured whole: exact, and a stream
  that ends before its end-of-stream marker is reported as truncated;
* a larger one: a prefix is decompressed (at most ``SAMPLE_IN`` compressed or ``SAMPLE_OUT``
  decompressed bytes) and its ratio extrapolated to the file; the trailer is used only when one of
  ISIZE + k·4 GiB agrees with that extrapolation (within ``AGREE``) and with deflate's largest
  possible ratio (``MAX_RATIO``) — then it gives the exact size, the 4 GiB wrap included;
  otherwise the extrapolation stands (a truncated file, or several gzip members, whose trailer
  is the last member's).

Decompression is streamed with a bounded output per call, so a gzip bomb is counted, not held.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

from bloomline.storage import open_input, upath

MAX_RATIO = 1032
"""Deflate's largest compression ratio (a 258-byte match coded in one bit pair at best, about
1032:1): a trailer claiming more than this × the file's size cannot be right."""
SAMPLE_IN = 4 << 20
"""Compressed bytes decompressed, at most, to measure a large file's ratio."""
SAMPLE_OUT = 64 << 20
"""Decompressed bytes counted, at most, in that sample (a highly compressed file reaches this first)."""
AGREE = 0.5
"""A trailer candidate agrees with the extrapolation when within this fraction of it."""
WRAP = 1 << 32


@dataclass(frozen=True)
class GzipSize:
    text_bytes: int
    """The uncompressed size: exact when ``exact``, else an estimate."""
    exact: bool
    truncated: bool
    """The stream ended before its end-of-stream marker (known when the file was decompressed whole)."""
    how: str
    """How the size was found, in words (for messages)."""


def _count(path: Path, max_in: int, max_out: int) -> tuple[int, int, bool, bool]:
    """Decompress the gzip members of ``path`` from its start, counting: (compressed bytes read,
    decompressed bytes, whether the whole file was read, whether every member ended properly)."""
    d = zlib.decompressobj(31)
    used = out = 0
    whole = ended = False
    with open_input(path) as f:
        while used < max_in and out < max_out:
            buf = f.read(1 << 16)
            if not buf:
                whole, ended = True, d.eof
                break
            used += len(buf)
            data = buf
            while data and out < max_out:
                try:
                    piece = d.decompress(data, 1 << 20)
                except zlib.error:
                    return used, out, True, False  # corrupt: what came before is what it holds
                out += len(piece)
                if d.eof:  # a member ended; another may follow (concatenated gzip files are one stream)
                    data = d.unused_data
                    if not data.lstrip(b"\0"):
                        data = b""
                        continue
                    d = zlib.decompressobj(31)
                else:
                    data = d.unconsumed_tail
    return used, out, whole, ended


def gzip_text_size(path: str | Path) -> GzipSize:
    """The uncompressed size of the gzip file ``path`` (see the module docstring)."""
    path = upath(path)
    size = path.stat().st_size
    used, out, whole, ended = _count(path, SAMPLE_IN, SAMPLE_OUT)
    if whole:
        return GzipSize(out, ended, not ended, "decompressed whole" if ended else "decompressed up to where it breaks")
    guess = size * out / max(used, 1)
    with open_input(path) as f:
        f.seek(-4, 2)
        isize = int.from_bytes(f.read(4), "little")
    candidates = [isize + k * WRAP for k in range(size * MAX_RATIO // WRAP + 1)]
    best = min(candidates, key=lambda c: abs(c - guess))
    if abs(best - guess) <= AGREE * guess and best <= size * MAX_RATIO:
        wraps = (best - isize) // WRAP
        return GzipSize(
            best,
            True,
            False,
            "its trailer, agreeing with a decompressed prefix"
            + (f" ({wraps} × 4 GiB past what the trailer holds)" if wraps else ""),
        )
    return GzipSize(
        int(guess),
        False,
        False,
        "extrapolated from a decompressed prefix (its trailer disagrees: truncated, or several gzip members)",
    )
