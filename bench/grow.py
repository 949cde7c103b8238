"""Grow a corpus of unique, realistic documents from ../shared/corpus, for benchmarks at scale:
per-language Markov walks with ``--dup-rate`` of duplicates put back (tests/support/grow.py).

    python -m bench.grow OUT_DIR --mb 256 [--dup-rate 0.04] [--seed 0]

Output: ``OUT_DIR/<lang>.jsonl``, the same for the same arguments; a finished folder is reused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.support.grow import SHARED, grow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--mb", type=float, default=256)
    ap.add_argument("--dup-rate", type=float, default=0.04)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"{SHARED} not found")
    s = grow(args.out, args.mb, args.dup_rate, args.seed)
    print(f"{args.out}: {s['documents']:,} documents, {s['bytes'] / 1e6:,.1f} MB, {len(s['languages'])} languages")


if __name__ == "__main__":
    main()
