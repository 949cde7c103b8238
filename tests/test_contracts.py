"""Each contract's document states the version its code writes: the version is defined once, in
the code, and the document that describes it is checked against it (not kept in step by hand)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stated(doc: str, pattern: str) -> int:
    found = re.findall(pattern, (REPO / doc).read_text(encoding="utf-8"), re.M)
    assert len(found) == 1, f"{doc}: {len(found)} statements of its current version"
    return int(found[0])


def test_prepared_data_format():
    from data_prep.storage.shards import FORMAT_VERSION

    assert stated("data_prep/FORMAT.md", r"^\| `format_version` \| (\d+) \|") == FORMAT_VERSION


def test_checkpoint_format():
    from training.checkpoint.meta import FORMAT_VERSION, READS_VERSIONS

    assert stated("training/CHECKPOINT.md", r"^\| `format_version` \| (\d+) \(") == FORMAT_VERSION
    assert FORMAT_VERSION == max(READS_VERSIONS)


def test_results_format():
    from eval.results.table import RESULTS_VERSION

    assert stated("eval/RESULTS.md", r"^## results \(version (\d+)\)") == RESULTS_VERSION
    assert stated("eval/RESULTS.md", r"it reads versions 1 to (\d+)") == RESULTS_VERSION
