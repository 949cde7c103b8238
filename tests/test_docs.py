"""The README and docs/: every relative link resolves, the layout page is the tree's (generated:
``python -m tests.test_docs --write`` rewrites it), and the copy of prepare's passes in
docs/prepare.md is data_prep/pipeline.py's table."""

import ast
import re
import sys
from pathlib import Path

from bloomline.imports import LAYERS, ROOMS

REPO = Path(__file__).resolve().parents[1]

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
OTHER_FOLDERS = {
    "configs": "the YAML recipes, a folder per kind (flows/config.py `SCHEMAS`)",
    "bench": "benchmarks, run by hand (`python -m bench.NAME`), printing figures (benchmarks.md)",
    "tests": "the tests, mirroring the source tree; `tests/support/`, the helpers they (and `bench/`) share; "
    "`tests/bench/`, the tests of the benchmarks' helpers",
    "docs": "these pages",
}


def layout_page() -> str:
    """docs/layout.md: every package of the layers, with the first sentence of its docstring, and
    each layer's rooms, lowest first (bloomline/imports.py ``ROOMS``)."""
    lines = [
        "# Layout",
        "",
        "Every package, with the first sentence of its docstring, and each layer's rooms, lowest first "
        "(each imports only those before it). Generated from the tree "
        "(`python -m tests.test_docs --write`; a test checks it); [design.md](design.md) says why it is laid "
        "out so.",
        "",
    ]
    for layer in LAYERS:
        rooms = " ← ".join(f"`{r}/`" if (REPO / layer / r).is_dir() else f"`{r}`" for r in ROOMS[layer])
        lines += [f"## `{layer}/`", "", f"Rooms: {rooms}.", ""]
        for init in sorted((REPO / layer).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
            first = " ".join(doc.split()).split(". ")[0].rstrip(".")
            lines.append(f"- `{init.parent.relative_to(REPO)}/`: {first}.")
        lines.append("")
    lines += ["## Beside them", ""]
    lines += [f"- `{name}/`: {what}." for name, what in OTHER_FOLDERS.items()]
    return "\n".join(lines) + "\n"


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_the_layout_page_lists_every_package():
    assert (REPO / "docs" / "layout.md").read_text(encoding="utf-8") == layout_page(), (
        "docs/layout.md is not the tree's: python -m tests.test_docs --write"
    )
    assert all((REPO / name).is_dir() for name in OTHER_FOLDERS)


def test_the_passes_in_the_docs_are_the_drivers():
    from data_prep.pipeline import PASSES

    listed = re.findall(r"^\| `(\w+)` \|", (REPO / "docs" / "prepare.md").read_text(encoding="utf-8"), re.M)
    assert listed == [p.name for p in PASSES]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    (REPO / "docs" / "layout.md").write_text(layout_page(), encoding="utf-8")
