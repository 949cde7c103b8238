"""Decontamination against evaluation tasks (data_prep/steps/decontaminate.py): planted items in a
spaced and an unspaced language are found through case, punctuation and spacing and dropped with
the item named; a near miss one unit short of an n-gram is kept; in a prepare run the drop log
equals the ledger, the manifest names the task files by sha256, and a SIGKILL during the step
then a rerun gives the uninterrupted run's bytes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bloomline.config import load_config
from bloomline.task_spec import TaskSpec
from data_prep.config import DecontaminateConfig, PrepareConfig, SourceConfig

REPO = Path(__file__).resolve().parents[3]

STORY_EN = [
    "Maria packed her grandfather's old violin into the blue case.",
    "The train to the village left at dawn.",
    "She practised the waltz in her head the whole way.",
    "At the station her cousins were waiting with flowers.",
]
STORY_ZH = [
    "小明每天早上六点起床，",
    "然后骑自行车去学校上课。",
    "他在路上总是经过一家面包店，",
    "老板会送给他一个热乎乎的包子。",
]
SHORT_EN = ["Tom ran.", "He fell.", "He cried.", "Mom came."]  # 10 words with its endings: shorter than a 13-gram


def story(sents: list[str], k: int) -> dict:
    return {
        **{f"input_sentence_{i + 1}": s for i, s in enumerate(sents)},
        "sentence_quiz1": "Yes.",
        "sentence_quiz2": "No.",
        "answer_right_ending": 1 + k % 2,
    }


def task_folder(root: Path) -> Path:
    data = root / "xstorycloze"
    data.mkdir(parents=True)
    other = story(["An unrelated first line about rivers and stones.", "It rained.", "Nobody came.", "The end."], 0)
    (data / "en.jsonl").write_text(
        json.dumps(other) + "\n" + json.dumps(story(STORY_EN, 1)) + "\n" + json.dumps(story(SHORT_EN, 2)) + "\n"
    )
    (data / "zh-Hans.jsonl").write_text(json.dumps(story(STORY_ZH, 1), ensure_ascii=False) + "\n")
    return data


def test_items_are_found_through_case_punctuation_and_spacing_and_a_near_miss_is_kept(tmp_path):
    from data_prep.steps.decontaminate import Decontaminator, build_index, load_index
    from data_prep.steps.document import Document, Ledger
    from data_prep.storage.droplog import DropLog

    cfg = DecontaminateConfig(tasks=[TaskSpec(name="xstorycloze", data=str(task_folder(tmp_path)))])
    summary = build_index(cfg, tmp_path / "index")
    files = {f["lang"]: f for f in summary["files"]}
    assert files["en"]["items"] == 3 and files["en"]["too_short"] == 1 and files["zh-Hans"]["too_short"] == 0
    en_words = " ".join(STORY_EN).split()
    zh = "".join(STORY_ZH).replace("，", "").replace("。", "")
    docs = {
        # the story inside other text, upper case, its punctuation changed: found
        "en-hit": ("en", "Some words before. " + " ".join(STORY_EN).upper().replace(".", " !! ") + " And after."),
        # 12 of its words in a row (one short of a 13-gram), then other words: kept
        "en-near": ("en", "Before it " + " ".join(en_words[10:22]) + " and then something else entirely different."),
        # the Chinese story with its punctuation dropped and spaces put in: found by character n-grams
        "zh-hit": ("zh-Hans", "今天天气很好。" + " ".join(zh[i : i + 3] for i in range(0, len(zh), 3)) + "。结束了"),
        # 19 of its characters (one short of a 20-character n-gram): kept
        "zh-near": ("zh-Hans", "今天天气很好。" + zh[5:24] + "，我们去公园散步吧。"),
        # the short item's text: too short to be indexed, so kept
        "en-short": ("en", "Tom ran. He fell. He cried. Mom came."),
    }
    ledger = Ledger(DropLog(100))
    step = Decontaminator(cfg, load_index(tmp_path / "index"), ledger)
    kept = [
        d.id
        for d in step.run(
            Document(text, lang, id_, f"x.jsonl:{k}") for k, (id_, (lang, text)) in enumerate(docs.items())
        )
    ]
    assert kept == ["en-near", "zh-near", "en-short"]
    rows = {r["id"]: r for r in ledger.log.rows}
    assert (
        rows["en-hit"]["duplicate_of"] == "xstorycloze/en.jsonl:2"
        and rows["zh-hit"]["duplicate_of"] == "xstorycloze/zh-Hans.jsonl:1"
    )
    assert {(r["stage"], r["outcome"], r["reason"]) for r in rows.values()} == {
        ("decontaminate", "filtered", "contaminated")
    }
    assert rows["en-hit"]["score"] >= 1 and step.report()["dropped"] == {"contaminated": 2}


def run_prepare(cfg_json: Path, out: Path) -> subprocess.Popen:
    code = (
        "import json, sys; from bloomline.config import from_dict; from data_prep.config import PrepareConfig; "
        "from data_prep.pipeline import run_all; "
        "run_all(from_dict(PrepareConfig, json.load(open(sys.argv[1]))), sys.argv[2])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(cfg_json), str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


@pytest.mark.slow
def test_prepare_drops_planted_items_books_them_and_is_byte_identical_after_a_kill(tmp_path):
    from bloomline.config import to_dict
    from bloomline.io import sha256_file
    from data_prep.storage.droplog import DROPPED_DIR
    from data_prep.storage.shards import load_manifest

    data = task_folder(tmp_path)
    en = json.loads((REPO / "data_prep/sample_corpus/text/en.jsonl").read_text().splitlines()[0])["text"]
    zh = json.loads((REPO / "data_prep/sample_corpus/text/zh-Hans.jsonl").read_text().splitlines()[0])["text"]
    planted = tmp_path / "inputs" / "planted.jsonl"
    planted.parent.mkdir()
    recs = [
        {"id": "plant-en", "lang": "en", "text": en[:300] + " " + " ".join(STORY_EN).lower() + " " + en[300:]},
        {"id": "plant-zh", "lang": "zh-Hans", "text": zh[:80] + "".join(STORY_ZH) + zh[80:]},
    ]
    planted.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    cfg = load_config(
        PrepareConfig, REPO / "configs/data/demo.yaml", [f"decontaminate.tasks=[{{name: xstorycloze, data: {data}}}]"]
    )
    cfg.sources.append(SourceConfig(path=str(planted)))
    cfg_json = tmp_path / "cfg.json"
    cfg_json.write_text(json.dumps(to_dict(cfg)))

    ref = tmp_path / "ref"
    proc = run_prepare(cfg_json, ref)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]
    m = load_manifest(ref)
    against = {f["lang"]: f for f in m["decontaminated_against"]["files"]}
    assert against["en"]["sha256"] == sha256_file(data / "en.jsonl") and against["zh-Hans"]["items"] == 1
    import pyarrow.dataset as ds

    rows = ds.dataset(ref / DROPPED_DIR, format="parquet").to_table().to_pylist()
    cont = {r["id"]: r["duplicate_of"] for r in rows if r["reason"] == "contaminated"}
    assert cont == {"plant-en": "xstorycloze/en.jsonl:2", "plant-zh": "xstorycloze/zh-Hans.jsonl:1"}
    booked = sum(e["filtered"].get("contaminated", 0) for e in m["languages"].values())
    assert booked == 2 and m["stages"]["decontaminate"]["dropped"] == {"contaminated": 2}

    # killed while the chunks pass (and so the step) runs, then run again: the same bytes
    out = tmp_path / "out"
    proc = run_prepare(cfg_json, out)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not list((out / ".work" / "chunks").glob("c*.json")):
        time.sleep(0.005)
    assert proc.poll() is None, "finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    proc = run_prepare(cfg_json, out)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]

    def tree(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run_stats.json" and ".work" not in p.parts
        }

    assert tree(out) == tree(ref)
