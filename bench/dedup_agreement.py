"""bloomline's deduplication against datatrove's MinHash on the same corpus: which documents each
removes, and why they differ, as a report (tests/support/dedup_agreement.py: the comparison and
its classes; tests/bench/test_dedup_agreement.py asserts that every difference has a reason).

    python -m bench.dedup_agreement INPUT_DIR [--workdir /tmp/bloomline-dedup-agreement]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.support.dedup_agreement import compare


def main() -> None:
    from importlib.metadata import version

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", type=Path)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bloomline-dedup-agreement"))
    args = ap.parse_args()
    r = compare(args.inputs.resolve(), args.workdir)
    print(
        f"{r['documents']:,} documents: bloomline removes {r['bloomline']:,}, datatrove {version('datatrove')} "
        f"removes {r['datatrove']:,}, both {r['both']:,}"
    )
    for (why, side), n in sorted(r["classes"].items()):
        print(f"  {side:15s} {why:20s} {n:5d}")
    print(f"unexplained: {r['unexplained'] or 'none'}")


if __name__ == "__main__":
    main()
