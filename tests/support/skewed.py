"""A corpus skewed as BLOOM's was: ../shared/corpus grown (tests/support/grow.py's per-language Markov
walks, 4% duplicates put back) in the proportions of ROOTS, BLOOM's training corpus
(``python -m bench.skewed OUT_DIR`` grows one and prints its table).

Proportions (written down here with their source, not fetched):

* the 46 natural languages: bytes per language of ROOTS, the BLOOM paper's language table
  (BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", arXiv
  2211.05100, Table 1, "Size in Bytes"), as the BigScience repository's plotting script for the
  paper lists them. Three entries of that list carry misplaced thousands separators
  (``70,1554``, ``14078,521``, ``2993407,159``); their digits are read as written: 701,554,
  14,078,521 and 2,993,407,159 bytes. (The BLOOM model card's percentages are of another
  measure and differ throughout, e.g. Tamil 0.20% there, 0.49% of these bytes.)
* code: the same table's 174,700,245,772 bytes of programming languages, split among the 13
  languages by their number of files in the BLOOM model card's table (extensions merged: C++'s
  cpp, cc, hpp, hh, H, c++, h++; PHP's php, phpt, php3, php4, php5, phps; TypeScript's ts, tsx).
  Files are not bytes; no finer split was published.

ROOTS spans 2.8 million to one (English 485 GB, Chi Tumbuka 170 KB). Kept as is, a corpus whose
smallest language can hold a training, a validation and a test split would need terabytes, so
every language gets at least ``floor_kb``: above the floor the proportions are ROOTS', below it
the languages sit at the floor (the printed table says how many, and the skew that remains:
64 MB with a 32 KB floor keeps English at 600× the 26 smallest languages, about 60
documents each: enough for a training, a validation and a test split).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bloomline import languages
from tests.support.grow import grow

ROOTS_TEXT_BYTES = {  # arXiv 2211.05100 Table 1 (module docstring), by this corpus's file stems
    "ak": 701_554,
    "ar": 74_854_900_600,
    "as": 291_522_098,
    "bm": 391_747,
    "eu": 2_360_470_848,
    "bn": 18_606_823_104,
    "ca": 17_792_493_289,
    "ny": 1_187_405,
    "sn": 6_638_639,
    "tum": 170_360,
    "en": 484_953_009_124,
    "fon": 2_478_546,
    "fr": 208_242_620_434,
    "gu": 1_199_986_460,
    "hi": 24_622_119_985,
    "ig": 14_078_521,
    "id": 19_972_325_222,
    "zu": 8_511_561,
    "kn": 2_098_453_560,
    "ki": 359_615,
    "rw": 40_428_299,
    "rn": 3_272_550,
    "ln": 1_650_804,
    "lg": 4_568_367,
    "ml": 3_662_571_498,
    "mr": 1_775_483_122,
    "ne": 2_551_307_393,
    "nso": 1_764_506,
    "or": 1_157_100_133,
    "pt": 79_277_543_375,
    "pa": 1_572_109_752,
    "st": 751_034,
    "tn": 1_502_200,
    "zh-Hans": 261_019_433_892,
    "es": 175_098_365_045,
    "sw": 236_482_543,
    "ta": 7_989_206_220,
    "te": 2_993_407_159,
    "zh-Hant": 762_489_150,
    "tw": 1_265_041,
    "ur": 2_781_329_959,
    "vi": 43_709_279_959,
    "wo": 3_606_973,
    "xh": 14_304_074,
    "ts": 707_634,
    "yo": 89_695_835,
}
ROOTS_CODE_BYTES = 174_700_245_772
CODE_FILES = {lang.code.removeprefix("code-"): lang.bloom_code_files for lang in languages.code()}
"""Files per programming language in BLOOM's code data (bloomline/languages.py, from the model card)."""


def roots_shares() -> dict[str, float]:
    """Each language's share of ROOTS' bytes (file stems of ../shared/corpus), summing to 1."""
    files = sum(CODE_FILES.values())
    sizes = {**ROOTS_TEXT_BYTES, **{k: ROOTS_CODE_BYTES * n / files for k, n in CODE_FILES.items()}}
    total = sum(sizes.values())
    return {k: v / total for k, v in sorted(sizes.items())}


def skewed_targets(mb: float, floor_kb: float) -> dict[str, int]:
    """Bytes to grow per language: ``mb`` in ROOTS' shares, each at least ``floor_kb``."""
    return {k: max(int(floor_kb * 1e3), int(mb * 1e6 * s)) for k, s in roots_shares().items()}


def grow_skewed(out: Path, mb: float = 64, floor_kb: float = 32, seed: int = 0) -> dict:
    return grow(out, mb, seed=seed, targets=skewed_targets(mb, floor_kb))


def grow_test(out: Path, train: Path, kb: float, seed: int) -> dict:
    """A test corpus for a verdict that no run steers by: ``kb`` of every language, walked from
    the same chains as ``train`` with another seed and no planted duplicates, less any document
    whose text is also in ``train`` (short walks can repeat; a test document must be unseen)."""
    shares = skewed_targets(1, 0)
    summary = grow(out, 0, dup_rate=0.0, seed=seed, targets={k: int(kb * 1e3) for k in shares})
    seen = {
        hashlib.sha1(json.loads(line)["text"].encode()).digest()
        for f in sorted(train.glob("*.jsonl"))
        for line in f.read_text(encoding="utf-8").splitlines()
    }
    dropped = 0
    for f in sorted(out.glob("*.jsonl")):
        lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [l for l in lines if hashlib.sha1(json.loads(l)["text"].encode()).digest() not in seen]
        if len(kept) < len(lines):
            dropped += len(lines) - len(kept)
            f.write_text("".join(kept), encoding="utf-8")
    return {**summary, "dropped_as_seen": dropped}
