"""Kill the main job's driver anywhere, rerun it, and compare the result with an uninterrupted run.

    python -m bench.chaos [--kills 8] [--seed S] [--work DIR] [--config configs/pipeline/demo.yaml] [-o key=value ...]

The harness is tests/support/chaos.py (``tests/flows/stages/test_pipeline.py`` runs a few kills of it on
the demo recipe in CI); this runs ``--kills`` of its targets (default: one at each) at moments
drawn from a seed (drawn and printed unless given), then prints the kills and what differs from
the uninterrupted run as tables. Exit status 1 when a killed job left a process or a /dev/shm
buffer behind, or the results differ.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from bench.repo import REPO
from tests.support.chaos import TARGETS, chaos, differences, draw, uninterrupted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=len(TARGETS))
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bloomline-chaos"))
    ap.add_argument("--config", type=Path, default=REPO / "configs/pipeline/demo.yaml")
    ap.add_argument("-o", dest="overrides", action="append", default=[])
    ap.add_argument(
        "--reference", type=Path, default=None, help="an uninterrupted run of the same recipe to compare with"
    )
    args = ap.parse_args()
    seed = random.SystemRandom().randrange(2**31) if args.seed is None else args.seed
    print(f"seed {seed} (python -m bench.chaos --seed {seed} draws the same moments)")
    args.work.mkdir(parents=True, exist_ok=True)
    ref = args.reference or args.work / f"uninterrupted-{seed}"
    windows_file = ref.parent / f"{ref.name}.windows.json"
    if args.reference is None or not windows_file.is_file():
        seconds, windows = uninterrupted(ref, args.config, args.overrides)
        windows_file.write_text(json.dumps({"seconds": seconds, "windows": windows}))
        print(f"uninterrupted run: {seconds:.1f} s")
    windows = json.loads(windows_file.read_text())["windows"]
    print("windows in the uninterrupted run (mean s): " + ", ".join(f"{k} {windows.get(k, 0):.2f}" for k in TARGETS))
    plan = draw(random.Random(seed), args.kills, windows)
    out = args.work / f"killed-{seed}"
    t0 = time.monotonic()
    kills = chaos(out, args.config, args.overrides, plan)
    print(f"\nkilled and rerun to the end in {time.monotonic() - t0:.1f} s\n")
    print("| # | aimed at | delay s | hit | s into the run | processes gone in s | alive 20 s later | /dev/shm left |")
    print("|---|---|---|---|---|---|---|---|")
    for i, k in enumerate(kills, 1):
        print(
            f"| {i} | {k.target} | {k.delay_s:.2f} | {k.hit} | {k.after_s:.1f} | {k.gone_s:.1f} | {len(k.leftovers)} | "
            f"{len(k.shm)} |"
        )
    diff = differences(ref, out)
    print("\n| compared with the uninterrupted run | differences |\n|---|---|")
    for kind, d in diff.items():
        print(f"| {kind} | {len(d)}{': ' + ', '.join(d[:5]) if d else ''} |")
    left = sum(len(k.leftovers) for k in kills) + sum(len(k.shm) for k in kills)
    return 1 if left or any(diff.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
