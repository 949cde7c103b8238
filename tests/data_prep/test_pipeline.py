"""The stage sequence without Prefect (serial map): ledger, contract, determinism, resume."""

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bloomline import languages
from bloomline.config import load_config
from bloomline.errors import DataError
from bloomline.io import TMP_MARK
from data_prep.config import PrepareConfig, SourceConfig
from data_prep.pipeline import run_all
from data_prep.storage.shards import load_manifest
from tests.support.prepare_runs import tree_bytes

REPO = Path(__file__).resolve().parents[2]


def demo_cfg(*overrides) -> PrepareConfig:
    return load_config(PrepareConfig, REPO / "configs/data/demo.yaml", list(overrides))


def run_demo(tmp_path, bad_inputs, *overrides):
    bad = tmp_path / "inputs" / "bad.jsonl"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad_inputs(bad)
    cfg = demo_cfg(*overrides)
    cfg.sources.append(SourceConfig(path=str(bad)))
    out = tmp_path / "out"
    return cfg, out, run_all(cfg, out)


def test_ledger_balances_and_contract_holds(tmp_path, bad_inputs, shard_table):
    cfg, out, m = run_demo(tmp_path, bad_inputs)
    m = load_manifest(out)
    langs = m["languages"]
    for lang, e in langs.items():
        total = e["docs_kept"] + sum(e["filtered"].values()) + sum(e["duplicates"].values()) + sum(e["errors"].values())
        assert total == e["docs_in"], lang
    sample_records = sum(
        1 for f in (REPO / "data_prep/sample_corpus").rglob("*.jsonl") for l in f.read_text().splitlines() if l.strip()
    )
    assert m["totals"]["input_records"] == sample_records + 12
    assert m["totals"]["errors"] >= 10
    # every sample-corpus language is present, with training and validation data
    present = {p.stem for p in (REPO / "data_prep/sample_corpus").rglob("*.jsonl")}
    for stem in present:
        code = languages.resolve(stem) or languages.resolve(f"code-{stem}")
        assert langs[code]["docs_kept"] > 0 and langs[code]["valid_docs"] >= 1, code
    assert abs(sum(m["blend"].values()) - 1) < 1e-6
    # shards: checksums, one language per shard, offsets valid, sample fits bucket
    eos = m["tokenizer"]["eos_id"]
    for s in m["shards"]:
        t = shard_table(out, s)
        assert set(t.column("lang").to_pylist()) == {s["lang"]}
        for ids, offs in zip(t.column("input_ids").to_pylist()[:50], t.column("doc_offsets").to_pylist()[:50]):
            assert len(ids) <= s["bucket"] and offs[0] == 0 and offs == sorted(set(offs))
            # a document boundary inside a sample follows an </s>
            assert all(ids[o - 1] == eos for o in offs[1:])
    # tokenizer recorded with checksum
    from bloomline.io import sha256_file

    assert sha256_file(out / m["tokenizer"]["path"]) == m["tokenizer"]["sha256"]
    assert m["stages"]["langid"]["verified"] > 0
    assert not (out / ".work").exists()


def test_deterministic_resumable_and_refuses_other_config(tmp_path, bad_inputs):
    cfg, out, _ = run_demo(tmp_path, bad_inputs, "keep_work=true")
    ref = tree_bytes(out)
    # the drop log and the scores are part of the compared output
    assert any(k.startswith("dropped/") for k in ref) and any(k.startswith("scores/") for k in ref)
    # Lose part of the finished work (as a kill would): the last stages' markers and some shards.
    (out / "manifest.json").unlink()
    shutil.rmtree(out / ".work" / "parts")
    for p in list((out / "shards").rglob("*.arrow"))[::3]:
        p.unlink()
    sorted((out / ".work" / "chunks").glob("c*.json"))[-2].unlink()
    (out / "shards" / f"stale.arrow{TMP_MARK}999").write_bytes(b"partial")
    # files of the user's in DIR, which may be any folder (--out ~): not bloomline's to delete
    users = [out / "notes.tmp-1", out / "mine" / f"draft{TMP_MARK}7"]
    for p in users:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"the user's")
    run_all(cfg, out)
    assert all(p.read_bytes() == b"the user's" for p in users)
    for p in users:
        p.unlink()
    (out / "mine").rmdir()
    assert tree_bytes(out) == ref
    # same command again: already complete, and nothing written (a work folder left behind would
    # make the finished output differ from an uninterrupted run's)
    shutil.rmtree(out / ".work", ignore_errors=True)
    assert run_all(cfg, out)["run_stats"] == {"already_complete": True}
    assert not (out / ".work").exists()
    # another config into the same folder is refused
    with pytest.raises(DataError, match="another config"):
        run_all(demo_cfg("seed=99"), out)
    # and other inputs, known by their bytes: one edited in place, same size and time, is refused too
    bad = Path(cfg.sources[-1].path)
    st, text = bad.stat(), bad.read_bytes()
    bad.write_bytes(text.replace(b"a", b"b", 1))
    os.utime(bad, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(DataError, match="other inputs"):
        run_all(cfg, out)


def test_vocab_too_large_fails_with_a_message(tmp_path, bad_inputs):
    with pytest.raises(Exception, match="tokenizer.vocab_size=200000 is too large"):
        run_demo(tmp_path, bad_inputs, "tokenizer.vocab_size=200000")


def test_explicit_blend_weights(tmp_path, bad_inputs):
    _, out, m = run_demo(tmp_path, bad_inputs, "blend.weights={en: 3, fr: 1}")
    assert m["blend"]["en"] == pytest.approx(0.75) and m["blend"]["fr"] == pytest.approx(0.25)
    others = {k: v for k, v in m["blend"].items() if k not in ("en", "fr")}
    assert len(others) > 40 and set(others.values()) == {0}  # every other language with data, weight 0


# An original English paragraph, long enough for near-duplicate shingles to be meaningful.
ESSAY = (
    "The river that runs past the old mill has changed its course three times in living memory. "
    "Each flood carried away a little of the western bank, and each spring the farmers rebuilt their "
    "fences a few steps further from the water. The miller kept a notebook in which he wrote the height "
    "of every flood, the date it began, and the names of the families who came to help. When his "
    "grandson found the notebook in a drawer, he counted forty years of entries and drew a map of the "
    "river for each decade. The maps show a slow bend moving north, a new island forming where the "
    "current slows, and a shallow ford that children now cross in summer without wetting their knees. "
    "Nobody planned any of this; the river simply followed the softest ground, as rivers always do."
)


def test_exact_and_near_duplicates_are_dropped_and_the_first_is_kept(tmp_path):
    """Three copies of one document in input order: the original, an exact duplicate (other id,
    other case and punctuation) and a near duplicate (one word changed): the last two go."""
    near = ESSAY.replace("forty years", "fifty years")
    docs = [
        {"id": "first", "text": ESSAY, "lang": "en"},
        {"id": "exact", "text": ESSAY.upper().replace(",", ""), "lang": "en"},
        {"id": "near", "text": near, "lang": "en"},
        {
            "id": "other",
            "text": ESSAY.replace("river", "canal")
            .replace("mill", "lock")
            .replace("flood", "storm")
            .replace("farmers", "bargemen")
            .replace("notebook", "ledger"),
            "lang": "en",
        },
    ]
    src = tmp_path / "dups.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in docs))
    cfg = demo_cfg("keep_work=true", "pack.valid_min_docs=0", "pack.valid_fraction=0.0", "tokenizer.vocab_size=300")
    cfg.sources = [SourceConfig(path=str(src))]
    m = run_all(cfg, tmp_path / "out")
    en = m["languages"]["en"]
    assert en["duplicates"] == {"exact": 1, "near": 1} and en["docs_kept"] == 2, en
    assert m["stages"]["dedup"]["duplicates"] == {"exact": 1, "near": 1}
    drops = json.loads(next((tmp_path / "out" / ".work" / "dedup").glob("c*.json")).read_text())["drops"]
    assert sorted(kind for _, kind in drops) == ["exact", "near"] and 0 not in [pos for pos, _ in drops]
    log = pq.read_table(tmp_path / "out" / "dropped" / "dedup-c000000.parquet").to_pylist()
    assert [(r["id"], r["reason"], r["duplicate_of"]) for r in log] == [
        ("exact", "exact", "first"),
        ("near", "near", "first"),
    ]
    assert log[0]["score"] == 1.0 and 0.8 <= log[1]["score"] < 1.0


def test_pii_is_counted_end_to_end_and_redacted_in_the_shards(tmp_path, shard_table):
    """Emails, IP addresses and phone numbers in the input: the manifest's per-language ledger
    and stages.pii count them, and the token ids of the shards hold the placeholders, not them."""
    import sentencepiece as spm

    text = (
        ESSAY + " Write to the archive at mill.records@example.org or archive-desk@example.net, call "
        "+44 20 7946 0958, or reach the scanner at 192.168.10.254 for copies of the maps."
    )
    src = tmp_path / "pii.jsonl"
    src.write_text(json.dumps({"id": "p1", "text": text, "lang": "en"}) + "\n")
    cfg = demo_cfg("pack.valid_min_docs=0", "pack.valid_fraction=0.0", "tokenizer.vocab_size=300")
    cfg.sources = [SourceConfig(path=str(src))]
    out = tmp_path / "out"
    m = run_all(cfg, out)
    want = {"email": 2, "ip_address": 1, "phone": 1}
    assert m["languages"]["en"]["pii"] == want and m["stages"]["pii"] == want
    sp = spm.SentencePieceProcessor(model_file=str(out / m["tokenizer"]["path"]))
    decoded = "".join(
        sp.decode(ids)
        for s in m["shards"]
        if s["split"] == "train"
        for ids in shard_table(out, s).column("input_ids").to_pylist()
    )
    assert decoded.count("<EMAIL>") == 2 and "<IP_ADDRESS>" in decoded and "<PHONE>" in decoded
    assert "example.org" not in decoded and "192.168" not in decoded and "7946" not in decoded
