"""A corpus skewed as BLOOM's was: ../shared/corpus grown in the proportions of ROOTS, BLOOM's
training corpus, every language at least ``--floor-kb`` (tests/support/skewed.py: the table and
its sources); prints each language's ROOTS share and target.

    python -m bench.skewed OUT_DIR [--mb 64] [--floor-kb 32] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.support.grow import SHARED
from tests.support.skewed import grow_skewed, roots_shares, skewed_targets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--mb", type=float, default=64)
    ap.add_argument("--floor-kb", type=float, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"{SHARED} not found")
    t = skewed_targets(a.mb, a.floor_kb)
    s = grow_skewed(a.out, a.mb, a.floor_kb, a.seed)
    floored = sorted(k for k, v in t.items() if v == int(a.floor_kb * 1e3))
    big = max(t, key=t.get)
    print(
        f"{a.out}: {s['documents']:,} documents, {s['bytes'] / 1e6:,.1f} MB, {len(t)} languages; "
        f"{len(floored)} at the {a.floor_kb:g} KB floor; largest {big} {t[big] / 1e6:.1f} MB = "
        f"{t[big] / min(t.values()):,.0f}× the smallest (ROOTS: {max(roots_shares().values()) / min(roots_shares().values()):,.0f}×)"
    )
    for k in sorted(t, key=lambda k: -t[k]):
        print(f"  {k:<12} ROOTS {100 * roots_shares()[k]:9.5f}%  target {t[k]:>12,} B")


if __name__ == "__main__":
    main()
