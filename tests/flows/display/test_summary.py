"""What the commands print at the end shows text from the data (error locations, reasons) and
the user's paths as written: rich markup inert, control characters as escapes."""

import copy
import io
import re

from rich.console import Console

from flows.display.summary import print_pipeline, print_summary

PLANTED = "[bold red]x[/]\x1b]0;pwned\x07\x9b31m"
SHOWN = "[bold red]x[/]\\x1b]0;pwned\\x07\\x9b31m"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printed(fn, res) -> str:
    out = io.StringIO()
    fn(res, Console(file=out, width=400, color_system=None))  # no styles of rich's own: any escape is planted
    return out.getvalue()


def test_the_prepare_summary_shows_file_derived_text_inert(demo_data):
    from data_prep.storage.shards import load_manifest

    m = copy.deepcopy(load_manifest(demo_data))
    lang = sorted(m["languages"])[0]
    m["languages"][lang]["error_examples"] = {"malformed_json": f"/data/{PLANTED}.jsonl:7"}
    m["languages"][lang]["errors"] = {f"pii.{PLANTED}": 1}
    text = printed(print_summary, m)
    assert f"/data/{SHOWN}.jsonl:7" in text and f"pii.{SHOWN}:1" in text and not CONTROL.search(text)


def test_the_pipeline_summary_shows_paths_and_reasons_as_written():
    where = f"/runs/{PLANTED}"
    res = {
        "stages": {"prepare": {"reused": False, "why": f"seed: 1 → {PLANTED}", "seconds": 1.0, "folder": where}},
        **{k: f"{where}/{k}" for k in ("run", "dashboard", "tensorboard", "checkpoints", "data", "export")},
    }
    text = printed(print_pipeline, res)
    assert f"/runs/{SHOWN}/dashboard" in text and not CONTROL.search(text)
