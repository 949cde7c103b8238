"""docs/configuration.md is what flows/cli/config_reference.py writes from the config dataclasses: a key
added to a recipe's dataclass and not to the page fails here."""

import dataclasses

from flows.cli.config_reference import PAGE, page
from flows.config import SCHEMAS


def test_the_reference_page_names_every_key_as_the_dataclasses_define_it():
    text = PAGE.read_text(encoding="utf-8")
    for cls in SCHEMAS.values():
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in text, f"{cls.__name__}.{f.name} is not in {PAGE}"
    assert "| `checkpoint.max_restarts` | integer | `3` |" in text and "| `pack.buckets` |" in text
    assert text == page(), f"{PAGE} is out of date: python -m flows.cli.config_reference"
