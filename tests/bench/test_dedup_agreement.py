"""bloomline's dedup against datatrove's MinHash on the dup corpus (tests/conftest.py): the two
agree on most removals, and every difference has one of the reasons tests/support/dedup_agreement.py
names (the kept member of a cluster, an unconfirmed collision, a pair near the threshold)."""

import pytest

from tests.support.dedup_agreement import compare


def test_every_difference_with_datatrove_has_a_reason(dup_inputs, tmp_path):
    pytest.importorskip("datatrove")
    r = compare(dup_inputs, tmp_path)
    print(r)
    assert r["bloomline"] > 400 and r["datatrove"] > 400
    assert r["both"] >= 0.8 * max(r["bloomline"], r["datatrove"])
    assert not r["unexplained"], r["unexplained"]
    # bloomline confirms what datatrove takes on trust: datatrove alone removes documents below the threshold
    assert r["classes"].get(("not confirmed", "datatrove only"), 0) > 0
    assert ("not confirmed", "bloomline only") not in r["classes"]
